/*
 * Prints the ABI facts of whichever nccl.h it is compiled against: struct sizes, field
 * offsets, enum values and macros. The test compiles it against strata's header and NVIDIA's
 * and requires the two outputs to be identical.
 */
#include <stddef.h>
#include <stdio.h>

#include "nccl.h"

#define OFF(t, f) printf(#t "." #f " %zu\n", offsetof(t, f))
#define VAL(x) printf(#x " %lld\n", (long long)(x))

int main(void) {
  VAL(sizeof(ncclConfig_t));
  OFF(ncclConfig_t, size);
  OFF(ncclConfig_t, magic);
  OFF(ncclConfig_t, version);
  OFF(ncclConfig_t, blocking);
  OFF(ncclConfig_t, cgaClusterSize);
  OFF(ncclConfig_t, minCTAs);
  OFF(ncclConfig_t, maxCTAs);
  OFF(ncclConfig_t, netName);
  OFF(ncclConfig_t, splitShare);
  OFF(ncclConfig_t, trafficClass);
  OFF(ncclConfig_t, commName);
  OFF(ncclConfig_t, collnetEnable);
  OFF(ncclConfig_t, CTAPolicy);
  OFF(ncclConfig_t, shrinkShare);
  OFF(ncclConfig_t, nvlsCTAs);
  OFF(ncclConfig_t, nChannelsPerNetPeer);
  OFF(ncclConfig_t, nvlinkCentricSched);
  OFF(ncclConfig_t, graphUsageMode);
  OFF(ncclConfig_t, numRmaCtx);
  OFF(ncclConfig_t, maxP2pPeers);
  OFF(ncclConfig_t, graphStreamOrdering);
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  VAL(c.size);
  VAL(c.magic);
  VAL(c.version);
  VAL(c.blocking);
  VAL(c.nvlinkCentricSched);
  VAL(c.graphStreamOrdering);
  VAL(c.netName == NULL);
  VAL(sizeof(ncclSimInfo_t));
  OFF(ncclSimInfo_t, estimatedTime);
  ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
  VAL(s.magic);
  VAL(s.estimatedTime);
  VAL(sizeof(ncclUniqueId));
  VAL(sizeof(ncclRedOp_t));
  VAL(sizeof(ncclDataType_t));
  VAL(sizeof(ncclResult_t));
  VAL(NCCL_UNIQUE_ID_BYTES);
  VAL(NCCL_SPLIT_NOCOLOR);
  VAL(NCCL_CONFIG_UNDEF_INT);
  VAL(NCCL_WIN_DEFAULT);
  VAL(NCCL_WIN_COLL_SYMMETRIC);
  VAL(NCCL_WIN_STRICT_ORDERING);
  VAL(NCCL_SUSPEND_MEM);
  VAL(ncclStatGpuMemSuspend);
  VAL(ncclStatGpuMemSuspended);
  VAL(ncclStatGpuMemPersist);
  VAL(ncclStatGpuMemTotal);
  VAL(sizeof(ncclCommMemStat_t));
  VAL(sizeof(ncclWaitSignalDesc_t));
  OFF(ncclWaitSignalDesc_t, ctx);
  VAL(NCCL_WIN_REQUIRED_ALIGNMENT);
  VAL(NCCL_SHRINK_DEFAULT);
  VAL(NCCL_SHRINK_ABORT);
  VAL(NCCL_REVOKE_DEFAULT);
  VAL(NCCL_VERSION_CODE);
  VAL(NCCL_VERSION(2, 28, 9));
  VAL(NCCL_VERSION(2, 30, 7));
  VAL(ncclSuccess);
  VAL(ncclUnhandledCudaError);
  VAL(ncclSystemError);
  VAL(ncclInternalError);
  VAL(ncclInvalidArgument);
  VAL(ncclInvalidUsage);
  VAL(ncclRemoteError);
  VAL(ncclInProgress);
  VAL(ncclSum);
  VAL(ncclProd);
  VAL(ncclMax);
  VAL(ncclMin);
  VAL(ncclAvg);
  VAL(ncclNumOps);
  VAL(ncclMaxRedOp);
  VAL(ncclInt8);
  VAL(ncclChar);
  VAL(ncclUint8);
  VAL(ncclInt32);
  VAL(ncclInt);
  VAL(ncclUint32);
  VAL(ncclInt64);
  VAL(ncclUint64);
  VAL(ncclFloat16);
  VAL(ncclHalf);
  VAL(ncclFloat32);
  VAL(ncclFloat);
  VAL(ncclFloat64);
  VAL(ncclDouble);
  VAL(ncclBfloat16);
  VAL(ncclFloat8e4m3);
  VAL(ncclFloat8e5m2);
  VAL(ncclNumTypes);
  VAL(ncclScalarDevice);
  VAL(ncclScalarHostImmediate);
  return 0;
}
