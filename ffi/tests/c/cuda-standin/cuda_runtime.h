/* A stand-in for CUDA's cuda_runtime.h: the few declarations NVIDIA's nccl.h needs, so that a
 * program can be compiled against NVIDIA's header on a host without CUDA. */
#ifndef STRATA_STANDIN_CUDA_RUNTIME_H
#define STRATA_STANDIN_CUDA_RUNTIME_H
#define CUDART_VERSION 12080
#define __DRIVER_TYPES_H__
typedef struct CUstream_st* cudaStream_t;
#endif
