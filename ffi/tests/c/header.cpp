// strata's nccl.h compiles as C++ (and links: the declarations are extern "C").
#include "nccl.h"

#include <cstdio>

int main() {
  int version = 0;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) return 1;
  if (config.magic != 0xcafebeef || sim.magic != 0x74685283) return 1;
  std::printf("C++ sees NCCL %d: %s\n", version, ncclGetErrorString(ncclInProgress));
  return 0;
}
