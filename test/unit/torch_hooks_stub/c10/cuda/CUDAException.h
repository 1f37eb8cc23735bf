// Stand-in for PyTorch's c10 header, for test/unit/torch_hooks_deferred_test.cpp only: the hooks'
// deferred frees (python/refpool/_torch_hooks_deferred.cpp) built without PyTorch.
#pragma once
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#define C10_CUDA_CHECK(x)                                                                      \
  do {                                                                                         \
    if (const cudaError_t status_ = (x); status_ != cudaSuccess)                               \
      throw std::runtime_error("CUDA error " + std::to_string(static_cast<int>(status_)));     \
  } while (0)
