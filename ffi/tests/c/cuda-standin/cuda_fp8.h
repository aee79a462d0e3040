/* Stand-in for CUDA's cuda_fp8.h: nccl.h includes it but uses nothing from it. */
