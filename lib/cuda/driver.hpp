// The CUDA driver API, loaded at run time: one X-macro list of the entry points refpool uses,
// expanded into a table of pointers filled once, thread-safely, through cuGetProcAddress.
// Only files in lib/cuda/ include this (and cuda.h).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace refpool::detail::cuda {

// Each entry is the unversioned driver symbol and the CUDA version of the ABI refpool calls it
// with: the member's type is cudaTypedefs.h's PFN_<name>_v<version>, and cuGetProcAddress is asked
// for that version, so type and ABI agree whatever CUDA_VERSION the headers have. Asking for the
// headers' CUDA_VERSION is not safe: at 13000 the driver hands out cuCtxSynchronize_v2, which takes
// a context, while cuda.h still declares cuCtxSynchronize(void) (called without one, it synchronised
// nothing and returned CUDA_ERROR_CONTEXT_IS_DESTROYED). Versions: the newest ABI up to 12.0.
#define REFPOOL_CUDA_DRIVER_SYMBOLS(X) \
  X(cuInit, 2000) \
  X(cuDriverGetVersion, 2020) \
  X(cuDeviceGetCount, 2000) \
  X(cuDeviceGet, 2000) \
  X(cuDeviceGetName, 2000) \
  X(cuDevicePrimaryCtxRetain, 7000) \
  X(cuCtxGetCurrent, 4000) \
  X(cuCtxSetCurrent, 4000) \
  X(cuCtxSynchronize, 2000) \
  X(cuMemAlloc, 3020) \
  X(cuMemFree, 3020) \
  X(cuMemAllocAsync, 11020) \
  X(cuMemFreeAsync, 11020) \
  X(cuMemHostAlloc, 2020) \
  X(cuMemFreeHost, 2000) \
  X(cuMemGetInfo, 3020) \
  X(cuDeviceGetDefaultMemPool, 11020) \
  X(cuMemPoolSetAttribute, 11020) \
  X(cuMemPoolGetAttribute, 11020) \
  X(cuMemPoolTrimTo, 11020) \
  X(cuStreamCreate, 2000) \
  X(cuStreamDestroy, 4000) \
  X(cuStreamSynchronize, 2000) \
  X(cuStreamGetCaptureInfo, 11030) \
  X(cuThreadExchangeStreamCaptureMode, 10010) \
  X(cuEventCreate, 2000) \
  X(cuEventDestroy, 4000) \
  X(cuEventRecord, 2000) \
  X(cuStreamWaitEvent, 3020) \
  X(cuMemcpyAsync, 4000) \
  X(cuMemsetD8Async, 3020) \
  X(cuMemcpyPeerAsync, 4000) \
  X(cuDeviceCanAccessPeer, 4000) \
  X(cuCtxEnablePeerAccess, 4000) \
  X(cuDeviceGetAttribute, 2000) \
  X(cuMemGetAllocationGranularity, 10020) \
  X(cuMemAddressReserve, 10020) \
  X(cuMemAddressFree, 10020) \
  X(cuMemCreate, 10020) \
  X(cuMemRelease, 10020) \
  X(cuMemMap, 10020) \
  X(cuMemUnmap, 10020) \
  X(cuMemSetAccess, 10020) \
  X(cuGetErrorName, 6000) \
  X(cuGetErrorString, 6000)

struct driver_api {
#define REFPOOL_CUDA_DECLARE(name, abi) PFN_##name##_v##abi name = nullptr;
  REFPOOL_CUDA_DRIVER_SYMBOLS(REFPOOL_CUDA_DECLARE)
#undef REFPOOL_CUDA_DECLARE
  int version = 0;       ///< cuDriverGetVersion
  int device_count = 0;  ///< at least 1 once loaded
};

/// Oldest driver refpool accepts (CUDA 12.0: cuGetProcAddress_v2, stream-ordered allocation).
inline constexpr int minimum_driver_version = 12000;

/// The loaded driver. Throws `backend_unavailable` saying why it cannot be used.
const driver_api& driver();
/// Empty when the driver is usable, else the reason. Never throws.
const std::string& failure() noexcept;
/// The driver's device count and version (cuDriverGetVersion); valid once failure() is empty.
int device_count();
int version();
/// The retained primary context of `ordinal` (retained at first use). Throws
/// `backend_unavailable` for an ordinal out of range.
CUcontext context(int ordinal);
/// Throws `backend_error` (formatted by the shared GPU code) unless `result` is CUDA_SUCCESS.
void check(CUresult result, const char* call, const std::string& details = {});

}  // namespace refpool::detail::cuda
