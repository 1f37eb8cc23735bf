// The framework allocator: one process-wide cache over the backends of every device, behind the
// entry points PyTorch's pluggable allocator and CuPy's CFunctionAllocator call (refpool.h,
// "framework allocator"; the C API wraps this class: c_api/framework_c.cpp). The per-request path
// is a cache-level allocation (the calling thread's slot) plus the pointer table; configuration
// and per-device backends are made once, under a mutex, then read lock-free. While a CUDA graph is
// captured, requests its filter accepts go to a private pool instead (private_pools.hpp).
//
// Internal, not API: its users are frameworks, which call the C entry points; a C++ program
// reaches the same process-wide cache through them too (refpool_allocator_cache). Its messages
// name those entry points, as the caller knows them.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include <refpool/adaptors.hpp>
#include <refpool/alloc_cache.hpp>
#include <refpool/error.hpp>
#include <refpool/pointer.hpp>

#include "framework/private_pools.hpp"

namespace refpool::detail {

/// Where the framework allocator's memory comes from (numbered as refpool.h's refpool_runtime).
enum class framework_runtime : std::uint8_t { cuda = 0, hip = 1, host = 2 };

/// What the framework allocator is made of; fixed at its first use.
struct framework_config {
  framework_runtime runtime = framework_runtime::cuda;
  memory_kind kind = memory_kind::device;  ///< device or device_async (the host runtime ignores it)
  cache_options cache;
};

class framework_allocator {
 public:
  static constexpr int max_devices = 64;

  /// The process's allocator, made at the first call. Never destroyed: frees may come from
  /// static destructors.
  static framework_allocator& instance() {
    static auto* made = new framework_allocator;
    return *made;
  }

  /// Sets what the allocator is made of, before its first use. `read()` runs under the
  /// allocator's lock once the allocator is known to be unused, and returns the configuration;
  /// whatever it throws leaves the allocator exactly as it was (a rejected configure changes
  /// nothing). Throws config_error once the cache was made (by an allocation or cache()).
  template <class Read>
  void configure(Read read) {
    std::lock_guard guard(mutex_);
    if (cache_ != nullptr)
      throw config_error(
          "refpool: refpool_allocator_configure: the framework allocator is already in use (its cache was made by "
          "an allocation or by refpool_allocator_cache); configure it before either");
    framework_config chosen = read();
    config_ = std::move(chosen);  // nothing below throws
    configured_ = true;
  }

  /// The allocator's cache, made at the first call (from the configuration, else REFPOOL_CONF).
  std::shared_ptr<alloc_cache> cache();

  /// `bytes` for `stream` on `device`, as a pointer the pointer table keeps (refpool::free_pointer
  /// frees it); nullptr for 0 bytes. Out of memory, the released private pools give their memory
  /// back and the request is made once more (PyTorch's allocator frees a released graph pool's
  /// blocks before it gives up). Throws as alloc_cache::allocate, and invalid_argument for a device
  /// outside 0 to max_devices - 1.
  void* allocate(std::size_t bytes, int device, stream_ref stream) {
    if (bytes == 0) return nullptr;
    try {
      return allocate_now(bytes, device, stream);
    } catch (const out_of_memory&) {
      // Made again even when this call frees nothing: another thread's empty_cache may have given
      // back what the request needs since its attempt (drop_freeable waits for one in progress).
      pools_.drop_freeable();
    }
    return allocate_now(bytes, device, stream);
  }

  /// Caching on (the default) or off (PyTorch's caching_allocator_enable): while off, a request
  /// that no private pool takes is the backend's own allocation, freed when given back, and the
  /// cache neither serves nor counts it. Requests routed to private pools stay theirs: a captured
  /// graph replays into its pool's memory. Buffers keep the way they were served when it changes.
  void set_caching(bool on) noexcept { uncached_.store(!on, std::memory_order_relaxed); }
  /// False after set_caching(false), and under REFPOOL_NO_CACHING=on (nothing caches then).
  [[nodiscard]] bool caching() const noexcept {
    return !uncached_.load(std::memory_order_relaxed) && !no_caching_in_environment();
  }

  /// Caps the bytes the allocator (its cache and private pools) holds from `device`.
  void set_device_limit(int device, std::size_t bytes);
  /// Frees the idle memory of the cache and of the released private pools (private_pools::drop_freeable).
  void empty_cache();
  /// Routes `device`'s requests that `filter` accepts to private pool `pool` (private_pools::begin),
  /// whose cache takes the allocator's options. Takes `context` in every case.
  void begin_pool(int device, private_pools::id pool, private_pools::stream_filter filter, void* context,
                  void (*drop)(void*));
  /// refpool_allocator_pool_take: the idle `bytes` at `address` of private pool `pool` on
  /// `device`, handed out again for `stream` at that address (take_idle_at), as a pointer the
  /// pointer table keeps. Throws invalid_argument (no such pool, a device it never served, and as
  /// take_idle_at), and what take_idle_at throws.
  void* take_in_pool(int device, private_pools::id pool, void* address, std::size_t bytes, stream_ref stream);
  private_pools& pools() noexcept { return pools_; }

 private:
  framework_allocator() = default;

  void* allocate_now(std::size_t bytes, int device, stream_ref stream) {
    if (pools_.routing()) [[unlikely]] {
      if (private_pools::target pool = pools_.route(device, stream.handle); pool.cache != nullptr)
        return to_pointer(pool.cache->allocate(pool.be, bytes, stream));
    }
    if (uncached_.load(std::memory_order_relaxed)) [[unlikely]]
      return allocate_uncached(bytes, device, stream);
    alloc_cache* cache = made_.load(std::memory_order_acquire);
    if (cache == nullptr) cache = this->cache().get();
    return to_pointer(cache->allocate(backend_for(device), bytes, stream));
  }

  const backend& backend_for(int device) {
    if (device >= 0 && device < max_devices) [[likely]] {
      if (const backend* known = backends_[static_cast<std::size_t>(device)].load(std::memory_order_acquire))
        return *known;
    }
    return make_backend(device);
  }
  const backend& make_backend(int device);
  void* allocate_uncached(std::size_t bytes, int device, stream_ref stream);
  static bool no_caching_in_environment() noexcept;

  std::mutex mutex_;
  framework_config config_;  // its cache options count only when configured_
  bool configured_ = false;
  cache_options in_use_options_;  // the cache's, once made
  std::shared_ptr<alloc_cache> cache_;
  std::atomic<alloc_cache*> made_{nullptr};
  std::atomic<bool> uncached_{false};  // set_caching(false)
  std::array<std::atomic<const backend*>, max_devices> backends_{};
  std::array<std::shared_ptr<byte_budget>, max_devices> budgets_{};  // under mutex_
  private_pools pools_;
};

}  // namespace refpool::detail
