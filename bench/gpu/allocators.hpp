// The allocators the GPU benchmarks compare, behind one small static interface:
//   handle allocate(bytes, stream); void deallocate(handle&&, stream);
//   void begin_iteration(); void end_iteration();   (refpool: a cache scope)
//   counters report() const;                         (what each allocator can tell about itself)
// Anchors that need optional software (CUB, libtorch) are compiled only when Meson found it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <refpool/refpool.hpp>

#include "../../lib/cuda/driver.hpp"

#if REFPOOL_BENCH_CUB
#include <cub/util_allocator.cuh>
#endif
#if REFPOOL_BENCH_TORCH
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace refpool::bench {

using detail::cuda::check;
using detail::cuda::driver;

/// What an allocator reports after a run; unset fields are unknown for that allocator.
struct counters {
  std::optional<std::uint64_t> driver_allocations;  ///< cuMemAlloc-like calls made
  std::optional<std::uint64_t> hits;
  std::optional<std::uint64_t> misses;
  std::optional<std::size_t> peak_reserved_bytes;  ///< most device memory held from the driver
};

struct raw_ptr {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

/// refpool: a cache scope per iteration, arrays through the pool.
class refpool_allocator {
 public:
  using handle = data_ref;
  explicit refpool_allocator(cache_options options = {}, std::string label = "refpool")
      : be_(cuda::device(0)),
        cache_(std::make_unique<alloc_cache>(options)),
        label_(std::move(label)),
        first_allocation_count_(be_.allocation_count()) {}
  [[nodiscard]] const std::string& name() const { return label_; }
  handle allocate(std::size_t bytes, CUstream s) { return refpool::allocate(be_, bytes, {s}); }
  template <class T>
  array<T> allocate_array(shape dims, CUstream s) {
    return empty<T>(be_, std::move(dims), {s});
  }
  void deallocate(handle&& h, CUstream) { h.reset(); }
  void begin_iteration() { scope_.emplace(*cache_); }
  void end_iteration() { scope_.reset(); }
  [[nodiscard]] counters report() const {
    const auto st = cache_->stats();
    // Driver calls: block allocations, and the calls that grew segments (cuMemCreate/cuMemMap
    // commits, or segment allocations); held: blocks, segments' free bytes and plan arenas.
    return {be_.allocation_count() - first_allocation_count_ + st.segment_grows, st.hits, st.misses,
            st.peak_reserved_bytes};
  }
  [[nodiscard]] alloc_cache& cache() { return *cache_; }
  ~refpool_allocator() {
    scope_.reset();
    cache_->reclaim();
  }

 private:
  backend be_;
  std::unique_ptr<alloc_cache> cache_;
  std::optional<scope> scope_;
  std::string label_;
  std::uint64_t first_allocation_count_;
};

/// Plain cuMemAlloc / cuMemFree: what every call costs without a cache.
class driver_allocator {
 public:
  using handle = raw_ptr;
  [[nodiscard]] std::string name() const { return "cuMemAlloc"; }
  handle allocate(std::size_t bytes, CUstream) {
    CUdeviceptr p = 0;
    check(driver().cuMemAlloc(&p, bytes), "cuMemAlloc");
    ++calls_;
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    return {reinterpret_cast<void*>(p), bytes};
  }
  void deallocate(handle&& h, CUstream) {
    check(driver().cuMemFree(reinterpret_cast<CUdeviceptr>(h.ptr)), "cuMemFree");
    live_ -= h.bytes;
  }
  void begin_iteration() {}
  void end_iteration() {}
  [[nodiscard]] counters report() const { return {calls_, {}, {}, peak_}; }

 private:
  std::uint64_t calls_ = 0;
  std::size_t live_ = 0;
  std::size_t peak_ = 0;
};

/// cuMemAllocAsync / cuMemFreeAsync on the device's default pool, release threshold UINT64_MAX.
class async_pool_allocator {
 public:
  using handle = raw_ptr;
  async_pool_allocator() {
    CUdevice device = 0;
    check(driver().cuDeviceGet(&device, 0), "cuDeviceGet");
    check(driver().cuDeviceGetDefaultMemPool(&pool_, device), "cuDeviceGetDefaultMemPool");
    cuuint64_t threshold = ~cuuint64_t{0};
    check(driver().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), "release threshold");
    cuuint64_t zero = 0;
    driver().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero);  // reset the high mark
  }
  [[nodiscard]] std::string name() const { return "cuMemAllocAsync"; }
  handle allocate(std::size_t bytes, CUstream s) {
    CUdeviceptr p = 0;
    check(driver().cuMemAllocAsync(&p, bytes, s), "cuMemAllocAsync");
    return {reinterpret_cast<void*>(p), bytes};
  }
  void deallocate(handle&& h, CUstream s) {
    check(driver().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(h.ptr), s), "cuMemFreeAsync");
  }
  void begin_iteration() {}
  void end_iteration() {}
  [[nodiscard]] counters report() const {
    cuuint64_t high = 0;
    driver().cuMemPoolGetAttribute(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high);
    return {{}, {}, {}, static_cast<std::size_t>(high)};
  }
  ~async_pool_allocator() { driver().cuMemPoolTrimTo(pool_, 0); }

 private:
  CUmemoryPool pool_ = nullptr;
};

#if REFPOOL_BENCH_CUB
/// CUB's CachingDeviceAllocator with its defaults (bins of powers of 8, up to 2 MiB... cached).
class cub_allocator {
 public:
  using handle = raw_ptr;
  // bin_growth 2, bins 2^8 .. 2^30, cache up to 64 GiB: generous, so it caches every size we use.
  cub_allocator() : cub_(2, 8, 30, std::size_t{64} << 30) {}
  [[nodiscard]] std::string name() const { return "CUB caching"; }
  handle allocate(std::size_t bytes, CUstream s) {
    void* p = nullptr;
    if (cub_.DeviceAllocate(&p, bytes, reinterpret_cast<cudaStream_t>(s)) != cudaSuccess)
      throw std::runtime_error("CUB allocation failed");
    return {p, bytes};
  }
  void deallocate(handle&& h, CUstream) { cub_.DeviceFree(h.ptr); }
  void begin_iteration() {}
  void end_iteration() {}
  [[nodiscard]] counters report() const { return {}; }
  ~cub_allocator() { cub_.FreeAllCached(); }

 private:
  cub::CachingDeviceAllocator cub_;
};
#endif

#if REFPOOL_BENCH_TORCH
/// PyTorch's c10 CUDACachingAllocator through its C++ API.
class torch_allocator {
 public:
  using handle = raw_ptr;
  torch_allocator() {
    namespace alloc = c10::cuda::CUDACachingAllocator;
    alloc::init(1);
    alloc::resetPeakStats(0);
    alloc::resetAccumulatedStats(0);
  }
  [[nodiscard]] std::string name() const { return "PyTorch c10"; }
  handle allocate(std::size_t bytes, CUstream s) {
    return {c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, reinterpret_cast<cudaStream_t>(s)), bytes};
  }
  void deallocate(handle&& h, CUstream) { c10::cuda::CUDACachingAllocator::raw_delete(h.ptr); }
  void begin_iteration() {}
  void end_iteration() {}
  [[nodiscard]] counters report() const {
    const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    // Index 0 of each stat array is the aggregate over pools.
    return {
        static_cast<std::uint64_t>(st.num_device_alloc), {}, {}, static_cast<std::size_t>(st.reserved_bytes[0].peak)};
  }
  ~torch_allocator() { c10::cuda::CUDACachingAllocator::emptyCache(); }
};
#endif

/// Calls `f(allocator)` for a fresh allocator of every kind built in, in a fixed order.
template <class A, class F>
void run_with(F& f) {
  A a;
  std::fprintf(stderr, "  [%s]\n", a.name().c_str());  // where a failure happened
  f(a);
}

template <class F>
void for_each_allocator(F&& f) {
  run_with<refpool_allocator>(f);
  run_with<driver_allocator>(f);
  run_with<async_pool_allocator>(f);
#if REFPOOL_BENCH_CUB
  run_with<cub_allocator>(f);
#endif
#if REFPOOL_BENCH_TORCH
  run_with<torch_allocator>(f);
#endif
}

}  // namespace refpool::bench
