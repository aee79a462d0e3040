/*
 * A fake CUDA driver (SONAME libcuda.so.1) for testing strata's GPU-pointer check on a host
 * without a GPU: cuPointerGetAttribute reports one marked address range as device memory and
 * everything else as not a CUDA allocation, as the real driver does for pageable memory.
 */
#include <stddef.h>
#include <stdint.h>

static uintptr_t device_base, device_end;

/* Marks [ptr, ptr + len) as "device memory". */
void fake_cuda_mark_device(void* ptr, size_t len) {
  device_base = (uintptr_t)ptr;
  device_end = device_base + len;
}

/* CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) */
int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  const int CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2, CU_POINTER_ATTRIBUTE_IS_MANAGED = 8;
  const int CUDA_ERROR_INVALID_VALUE = 1;
  if (ptr < device_base || ptr >= device_end) return CUDA_ERROR_INVALID_VALUE;
  if (attribute == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
    *(unsigned int*)data = 2; /* CU_MEMORYTYPE_DEVICE */
    return 0;
  }
  if (attribute == CU_POINTER_ATTRIBUTE_IS_MANAGED) {
    *(unsigned int*)data = 0;
    return 0;
  }
  return CUDA_ERROR_INVALID_VALUE;
}
