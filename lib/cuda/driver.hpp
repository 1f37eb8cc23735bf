// The CUDA driver API, loaded at run time: one X-macro list of the entry points refpool uses,
// expanded into a table of pointers filled once, thread-safely, through cuGetProcAddress.
// Only files in lib/cuda/ include this (and cuda.h).
#pragma once

#include <cuda.h>

#include <string>

namespace refpool::detail::cuda {

// Each name is the unversioned driver symbol; the header's macros (cuMemAlloc -> cuMemAlloc_v2)
// make the member and its type match the ABI that cuGetProcAddress returns for CUDA_VERSION.
#define REFPOOL_CUDA_DRIVER_SYMBOLS(X)                                                                                \
  X(cuInit)                                                                                                           \
  X(cuDriverGetVersion)                                                                                               \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDevicePrimaryCtxRetain) X(cuCtxGetCurrent)                \
      X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuMemAlloc) X(cuMemFree) X(cuMemAllocAsync) X(cuMemFreeAsync)          \
          X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemGetInfo) X(cuDeviceGetDefaultMemPool) X(cuMemPoolSetAttribute)    \
              X(cuMemPoolGetAttribute) X(cuMemPoolTrimTo) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) \
                  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuStreamWaitEvent) X(cuMemcpyAsync)           \
                      X(cuMemsetD8Async) X(cuMemcpyPeerAsync) X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess)       \
                          X(cuDeviceGetAttribute) X(cuMemGetAllocationGranularity) X(cuMemAddressReserve)             \
                              X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap)            \
                                  X(cuMemSetAccess) X(cuGetErrorName) X(cuGetErrorString)

struct driver_api {
#define REFPOOL_CUDA_DECLARE(name) decltype(&::name) name = nullptr;
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
