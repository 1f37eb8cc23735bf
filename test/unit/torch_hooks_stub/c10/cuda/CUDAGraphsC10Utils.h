// Stand-in for PyTorch's c10 header (see CUDAException.h here): a thread's capture mode for a scope.
#pragma once
#include <cuda_runtime_api.h>

namespace c10::cuda {
struct CUDAStreamCaptureModeGuard {
  explicit CUDAStreamCaptureModeGuard(cudaStreamCaptureMode desired) : mode(desired) {
    cudaThreadExchangeStreamCaptureMode(&mode);
  }
  ~CUDAStreamCaptureModeGuard() { cudaThreadExchangeStreamCaptureMode(&mode); }
  CUDAStreamCaptureModeGuard(const CUDAStreamCaptureModeGuard&) = delete;
  CUDAStreamCaptureModeGuard& operator=(const CUDAStreamCaptureModeGuard&) = delete;
  cudaStreamCaptureMode mode;
};
}  // namespace c10::cuda
