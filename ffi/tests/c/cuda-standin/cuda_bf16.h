/* Stand-in for CUDA's cuda_bf16.h: nccl.h includes it but uses nothing from it. */
