// Stand-in for PyTorch's c10 header (see CUDAException.h here): sets the current device for a scope.
#pragma once
#include <cuda_runtime_api.h>

namespace c10 {
using DeviceIndex = signed char;
namespace cuda {
struct CUDAGuard {
  explicit CUDAGuard(DeviceIndex device) {
    cudaGetDevice(&previous);
    cudaSetDevice(device);
  }
  ~CUDAGuard() { cudaSetDevice(previous); }
  CUDAGuard(const CUDAGuard&) = delete;
  CUDAGuard& operator=(const CUDAGuard&) = delete;
  int previous = 0;
};
}  // namespace cuda
}  // namespace c10
