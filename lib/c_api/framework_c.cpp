// The framework allocator's C entry points (refpool.h, "framework allocator"): PyTorch's
// pluggable allocator and CuPy's CFunctionAllocator call these; each wraps framework_allocator
// (framework/framework_allocator.hpp), checking the C arguments and turning exceptions into statuses.
#include <refpool/pointer.hpp>

#include <cstdio>

#include "c_api/cache_options_c.hpp"
#include "c_api/sized_struct.hpp"
#include "c_api/support.hpp"
#include "framework/framework_allocator.hpp"

using namespace refpool::c_api;
using refpool::detail::framework_allocator;

namespace {

// The configuration `options` and `cache` (null: REFPOOL_CONF's) ask for. Validates every field
// before the allocator changes anything, so a rejected configure leaves it exactly as it was
// (issue 23 row 5: a rejected runtime used to stick); runs under the allocator's lock, after its
// check that it is still unused.
refpool::detail::framework_config config_from(const refpool_allocator_options& options,
                                              const refpool_cache_options* cache) {
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
  refpool::detail::framework_config config;
  config.runtime = static_cast<refpool::detail::framework_runtime>(options.runtime);
  config.kind =
      options.kind == REFPOOL_MEMORY_DEVICE_ASYNC ? refpool::memory_kind::device_async : refpool::memory_kind::device;
  // config_error for a bad rounding or segments, or a bad REFPOOL_CONF
  config.cache = cache != nullptr ? from_c(*cache) : refpool::cache_options::from_environment();
  return config;
}

refpool::detail::private_pools::id pool_id(refpool_pool_id pool) { return {pool.first, pool.second}; }

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
    const refpool_allocator_options chosen =
        read_sized(&required(options, function, "options"), options_size, default_allocator_options, function,
                   "refpool_allocator_options");
    if (cache == nullptr) {
      framework_allocator::instance().configure([&] { return config_from(chosen, nullptr); });
    } else {
      const refpool_cache_options whole = read_options(cache, cache_size, function);
      framework_allocator::instance().configure([&] { return config_from(chosen, &whole); });
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

void refpool_allocator_set_caching(int on) { framework_allocator::instance().set_caching(on != 0); }

int refpool_allocator_caching(void) { return framework_allocator::instance().caching() ? 1 : 0; }

int refpool_allocator_routing_to_pools(void) { return framework_allocator::instance().pools().routing() ? 1 : 0; }

refpool_status refpool_allocator_pool_ids(refpool_pool_id* ids, size_t capacity, size_t* count) {
  return guarded([&] {
    size_t& result = required(count, "refpool_allocator_pool_ids", "count");
    if (ids == nullptr && capacity > 0)
      fail(REFPOOL_ERROR_INVALID_ARGUMENT, "refpool: refpool_allocator_pool_ids: ids is NULL, capacity is not 0");
    const std::vector<refpool::detail::private_pools::id> live = framework_allocator::instance().pools().ids();
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

refpool_status refpool_allocator_pool_take(int device, refpool_pool_id pool, void* address, size_t bytes, void* stream,
                                           void** out) {
  return guarded([&] {
    void*& result = required(out, "refpool_allocator_pool_take", "out");
    result = framework_allocator::instance().take_in_pool(device, pool_id(pool), address, bytes,
                                                          refpool::stream_ref{stream});
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
