// Stand-in for PyTorch's c10 header (see CUDAException.h here): the allocator calls and the pool id
// refpool's hooks use.
#pragma once
#include <c10/core/StorageImpl.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

namespace c10::cuda {
using CaptureId_t = unsigned long long;
using MempoolId_t = std::pair<CaptureId_t, CaptureId_t>;
namespace CUDACachingAllocator {
struct CUDAAllocator {
  virtual ~CUDAAllocator() = default;
  virtual DeleterFnPtr raw_deleter() const = 0;
};
CUDAAllocator* get();
void* raw_alloc_with_stream(std::size_t nbytes, cudaStream_t stream);
void raw_delete(void* ptr);
}  // namespace CUDACachingAllocator
}  // namespace c10::cuda
