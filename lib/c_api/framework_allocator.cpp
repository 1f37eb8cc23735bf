// The framework allocator: one process-wide cache over the GPU backends of every device, behind
// the exact entry points PyTorch's pluggable allocator and CuPy's CFunctionAllocator call. The
// per-request path is a cache-level allocation (the calling thread's slot) plus the pointer
// table; configuration and per-device backends are made once, under a mutex, then read lock-free.
// While a CUDA graph is captured, requests its filter accepts go to a private pool instead.
#include <refpool/adaptors.hpp>
#include <refpool/cuda.hpp>
#include <refpool/hip.hpp>
#include <refpool/pointer.hpp>

#include <array>
#include <atomic>
#include <cstdio>

#include "c_api/cache_options_c.hpp"
#include "c_api/pool_resource.hpp"
#include "c_api/private_pools.hpp"
#include "c_api/sized_struct.hpp"
#include "c_api/support.hpp"

using namespace refpool::c_api;

namespace {

class framework_allocator {
 public:
  static constexpr int max_devices = 64;

  static framework_allocator& instance() {
    static auto* made = new framework_allocator;  // leaked: frees may come from static destructors
    return *made;
  }

  // Validates every field before it changes anything, so a rejected configure leaves the
  // allocator exactly as it was (issue 23 row 5: a rejected runtime used to stick).
  // `cache`: the cache's options, whole (read_options), or null for REFPOOL_CONF's.
  void configure(const refpool_allocator_options& options, const refpool_cache_options* cache) {
    std::lock_guard guard(mutex_);
    if (cache_ != nullptr)
      fail(REFPOOL_ERROR_CONFIG,
           "refpool: refpool_allocator_configure: the framework allocator is already in use (its cache was made "
           "by an allocation or by refpool_allocator_cache); configure it before either");
    if (options.runtime != REFPOOL_RUNTIME_CUDA && options.runtime != REFPOOL_RUNTIME_HIP &&
        options.runtime != REFPOOL_RUNTIME_HOST)
      fail(REFPOOL_ERROR_CONFIG,
           fmt::format("refpool: refpool_allocator_options.runtime is {}; allowed: "
                       "REFPOOL_RUNTIME_CUDA (0), REFPOOL_RUNTIME_HIP (1), REFPOOL_RUNTIME_HOST (2)",
                       static_cast<int>(options.runtime)));
    if (options.runtime != REFPOOL_RUNTIME_HOST && options.kind != REFPOOL_MEMORY_DEVICE &&
        options.kind != REFPOOL_MEMORY_DEVICE_ASYNC)
      fail(REFPOOL_ERROR_CONFIG, fmt::format("refpool: refpool_allocator_options.kind is {}; allowed: "
                                             "REFPOOL_MEMORY_DEVICE (1), REFPOOL_MEMORY_DEVICE_ASYNC (2)",
                                             static_cast<int>(options.kind)));
    // config_error for a bad rounding or segments, or a bad REFPOOL_CONF
    const refpool::cache_options checked =
        cache != nullptr ? from_c(*cache) : refpool::cache_options::from_environment();
    options_ = options;  // nothing below throws
    cache_options_ = checked;
    configured_ = true;
  }

  std::shared_ptr<refpool::alloc_cache> cache() {
    std::lock_guard guard(mutex_);
    if (cache_ == nullptr) {
      in_use_options_ = configured_ ? cache_options_ : refpool::cache_options::from_environment();
      cache_ = std::make_shared<refpool::alloc_cache>(in_use_options_);
      made_.store(cache_.get(), std::memory_order_release);
    }
    return cache_;
  }

  void* allocate(std::size_t bytes, int device, refpool::stream_ref stream) {
    if (bytes == 0) return nullptr;
    if (pools_.routing()) [[unlikely]] {
      if (private_pools::target pool = pools_.route(device, stream.handle); pool.cache != nullptr)
        return refpool::to_pointer(pool.cache->allocate(pool.be, bytes, stream));
    }
    refpool::alloc_cache* cache = made_.load(std::memory_order_acquire);
    if (cache == nullptr) cache = this->cache().get();
    return refpool::to_pointer(cache->allocate(backend_for(device), bytes, stream));
  }

  void set_device_limit(int device, std::size_t bytes) {
    (void)backend_for(device);  // makes the device's budget
    std::lock_guard guard(mutex_);
    budgets_[static_cast<std::size_t>(device)]->set_capacity(bytes);
  }

  void empty_cache() {
    std::shared_ptr<refpool::alloc_cache> made;
    {
      std::lock_guard guard(mutex_);
      made = cache_;
    }
    if (made != nullptr) made->reclaim(0);
  }

  void begin_pool(int device, private_pools::id pool, refpool_stream_filter filter, void* context,
                  void (*drop)(void*)) {
    refpool::cache_options options;
    try {
      (void)cache();  // fixes the configuration: pools take the cache's options
      std::lock_guard guard(mutex_);
      options = in_use_options_;
    } catch (...) {
      if (drop != nullptr) drop(context);  // the context is ours from the call on
      throw;
    }
    pools_.begin(device, pool, filter, context, drop, options, [this](int d, private_pools::id p) {
      return refpool::backend(
          std::make_shared<pool_resource>(backend_for(d), fmt::format("private pool ({}, {})", p.first, p.second)));
    });
  }

  private_pools& pools() noexcept { return pools_; }

 private:
  const refpool::backend& backend_for(int device) {
    if (device >= 0 && device < max_devices) [[likely]] {
      if (const refpool::backend* known = backends_[static_cast<std::size_t>(device)].load(std::memory_order_acquire))
        return *known;
    }
    return make_backend(device);
  }

  const refpool::backend& make_backend(int device) {
    if (device < 0 || device >= max_devices)  // a refpool::error: it may reach PyTorch (see refpool_torch_malloc)
      throw refpool::invalid_argument(
          fmt::format("refpool: the framework allocator was asked for device {}; devices 0 to {} are supported", device,
                      max_devices - 1));
    std::lock_guard guard(mutex_);
    auto& slot = backends_[static_cast<std::size_t>(device)];
    if (const refpool::backend* known = slot.load(std::memory_order_relaxed)) return *known;
    const refpool::memory_kind kind = options_.kind == REFPOOL_MEMORY_DEVICE_ASYNC ? refpool::memory_kind::device_async
                                                                                   : refpool::memory_kind::device;
    auto runtime = std::make_shared<refpool::backend>(options_.runtime == REFPOOL_RUNTIME_HOST ? refpool::host_backend()
                                                      : options_.runtime == REFPOOL_RUNTIME_HIP
                                                          ? refpool::hip::device(device, kind)
                                                          : refpool::cuda::device(device, kind));
    // Under a budget (no cap until refpool_allocator_set_device_limit), charged by the cache and
    // the private pools alike. The aliasing pointer keeps the runtime's backend alive.
    auto budget = std::make_shared<refpool::byte_budget>(refpool::cache_options::unlimited);
    auto made = std::make_unique<refpool::backend>(std::make_shared<refpool::limiting_resource>(
        std::shared_ptr<refpool::resource>(runtime, &runtime->underlying()), budget));
    budgets_[static_cast<std::size_t>(device)] = std::move(budget);
    slot.store(made.get(), std::memory_order_release);
    return *made.release();  // kept for the life of the process, like the runtime's own backends
  }

  std::mutex mutex_;
  refpool_allocator_options options_{REFPOOL_RUNTIME_CUDA, REFPOOL_MEMORY_DEVICE};
  refpool::cache_options cache_options_;
  bool configured_ = false;
  refpool::cache_options in_use_options_;  // the cache's, once made
  std::shared_ptr<refpool::alloc_cache> cache_;
  std::atomic<refpool::alloc_cache*> made_{nullptr};
  std::array<std::atomic<const refpool::backend*>, max_devices> backends_{};
  std::array<std::shared_ptr<refpool::byte_budget>, max_devices> budgets_{};  // under mutex_
  private_pools pools_;
};

private_pools::id pool_id(refpool_pool_id pool) { return {pool.first, pool.second}; }

}  // namespace

extern "C" {

constexpr refpool_allocator_options default_allocator_options{REFPOOL_RUNTIME_CUDA, REFPOOL_MEMORY_DEVICE};
static_assert(ends_without_padding<refpool_allocator_options, sizeof(refpool_runtime) + sizeof(refpool_memory_kind)>,
              "refpool_allocator_options does not end with `kind`, or ends in padding (c_api.cpp says why)");

refpool_status refpool_allocator_options_init(refpool_allocator_options* options, size_t options_size) {
  return guarded([&] {
    write_sized(default_allocator_options, options, options_size, "refpool_allocator_options_init",
                "refpool_allocator_options");
  });
}

refpool_status refpool_allocator_configure(const refpool_allocator_options* options, size_t options_size,
                                           const refpool_cache_options* cache, size_t cache_size) {
  return guarded([&] {
    const char* function = "refpool_allocator_configure";
    const refpool_allocator_options chosen = read_sized(&required(options, function, "options"), options_size,
                                                        default_allocator_options, function, "refpool_allocator_options");
    if (cache == nullptr) {
      framework_allocator::instance().configure(chosen, nullptr);
    } else {
      const refpool_cache_options whole = read_options(cache, cache_size, function);
      framework_allocator::instance().configure(chosen, &whole);
    }
  });
}

refpool_status refpool_allocator_cache(refpool_cache* out) {
  return guarded([&] {
    refpool_cache& result = required(out, "refpool_allocator_cache", "out");
    result = make_handle<refpool_cache>(std::make_shared<cache_object>(framework_allocator::instance().cache()));
  });
}

refpool_status refpool_allocator_alloc(size_t bytes, int device, void* stream, void** out) {
  return guarded([&] {
    void*& result = required(out, "refpool_allocator_alloc", "out");
    result = framework_allocator::instance().allocate(bytes, device, refpool::stream_ref{stream});
  });
}

refpool_status refpool_allocator_set_device_limit(int device, size_t bytes) {
  return guarded([&] { framework_allocator::instance().set_device_limit(device, bytes); });
}

refpool_status refpool_allocator_empty_cache(void) {
  return guarded([&] { framework_allocator::instance().empty_cache(); });
}

refpool_status refpool_allocator_record_stream(void* ptr, void* stream) {
  return guarded([&] {
    if (ptr == nullptr) fail(REFPOOL_ERROR_INVALID_ARGUMENT, "refpool: refpool_allocator_record_stream: ptr is NULL");
    refpool::pointer_ref(ptr).record_stream(refpool::stream_ref{stream});
  });
}

refpool_status refpool_allocator_begin_pool(int device, refpool_pool_id pool, refpool_stream_filter filter,
                                            void* context, void (*drop_context)(void*)) {
  return guarded(
      [&] { framework_allocator::instance().begin_pool(device, pool_id(pool), filter, context, drop_context); });
}

refpool_status refpool_allocator_end_pool(int device, refpool_pool_id pool) {
  return guarded([&] { framework_allocator::instance().pools().end(device, pool_id(pool)); });
}

refpool_status refpool_allocator_release_pool(int device, refpool_pool_id pool) {
  return guarded([&] { framework_allocator::instance().pools().release(device, pool_id(pool)); });
}

int refpool_allocator_routing_to_pools(void) { return framework_allocator::instance().pools().routing() ? 1 : 0; }

refpool_status refpool_allocator_pool_ids(refpool_pool_id* ids, size_t capacity, size_t* count) {
  return guarded([&] {
    size_t& result = required(count, "refpool_allocator_pool_ids", "count");
    if (ids == nullptr && capacity > 0)
      fail(REFPOOL_ERROR_INVALID_ARGUMENT, "refpool: refpool_allocator_pool_ids: ids is NULL, capacity is not 0");
    const std::vector<private_pools::id> live = framework_allocator::instance().pools().ids();
    for (std::size_t i = 0; i < live.size() && i < capacity; ++i) ids[i] = {live[i].first, live[i].second};
    result = live.size();
  });
}

refpool_status refpool_allocator_pool_cache(refpool_pool_id pool, refpool_cache* out) {
  return guarded([&] {
    refpool_cache& result = required(out, "refpool_allocator_pool_cache", "out");
    std::shared_ptr<refpool::alloc_cache> cache = framework_allocator::instance().pools().cache_of(pool_id(pool));
    if (cache == nullptr)
      fail(REFPOOL_ERROR_INVALID_ARGUMENT,
           fmt::format("refpool: refpool_allocator_pool_cache: no private pool ({}, {})", pool.first, pool.second));
    result = make_handle<refpool_cache>(std::make_shared<cache_object>(std::move(cache)));
  });
}

void* refpool_torch_malloc(ptrdiff_t size, int device, void* stream) {
  if (size < 0) throw refpool::size_error(fmt::format("refpool: refpool_torch_malloc was asked for {} bytes", size));
  return framework_allocator::instance().allocate(static_cast<std::size_t>(size), device, refpool::stream_ref{stream});
}

void refpool_torch_free(void* ptr, ptrdiff_t, int, void*) {
  // Called from PyTorch's deleters, where an exception would end the process: a pointer refpool
  // does not keep (never expected from PyTorch) is reported on stderr and not freed.
  if (guarded([&] { refpool::free_pointer(ptr); }) != REFPOOL_OK) std::fprintf(stderr, "%s\n", refpool_last_error());
}

void* refpool_cupy_malloc(void*, size_t size, int device) {
  void* result = nullptr;
  if (guarded([&] { result = framework_allocator::instance().allocate(size, device, {}); }) != REFPOOL_OK)
    return nullptr;
  return result;
}

void refpool_cupy_free(void*, void* ptr, int) {
  // CuPy cannot be told of a failure here; a bad pointer is reported on stderr, never freed.
  if (guarded([&] { refpool::free_pointer(ptr); }) != REFPOOL_OK) std::fprintf(stderr, "%s\n", refpool_last_error());
}

}  // extern "C"
