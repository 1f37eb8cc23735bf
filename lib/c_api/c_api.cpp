// The C API (include/refpool/refpool.h): errors, backends, caches, scopes, buffers. Cache
// options are in cache_options_c.cpp; GPU backends, streams, pointers, steps and stats by name are
// in c_api_more.cpp; the framework allocator's entry points in framework_c.cpp.
#include "c_api/cache_options_c.hpp"
#include "c_api/sized_struct.hpp"
#include "c_api/support.hpp"

using namespace refpool::c_api;

namespace refpool::c_api {

// Input structs end with their last field, without padding (sized_struct.hpp). A field appended:
// name it here; one that would leave padding comes with an explicit padding field.
static_assert(ends_without_padding<refpool_scope_options, offsetof(refpool_scope_options, plan) + sizeof(const char*)>,
              "refpool_scope_options does not end with `plan`, or ends in padding");
static_assert(ends_without_padding<refpool_alloc_options, offsetof(refpool_alloc_options, cache) + sizeof(refpool_cache)>,
              "refpool_alloc_options does not end with `cache`, or ends in padding");

refpool::scope_options scope_options_from(const refpool_scope_options* options, std::size_t size,
                                          const char* function) {
  refpool::scope_options chosen;
  if (options == nullptr) return chosen;
  const auto given = read_sized(options, size, refpool_scope_options{}, function, "refpool_scope_options");
  chosen.uncached_warmup_entries = given.uncached_warmup_entries;
  if (given.plan != nullptr) chosen.plan = given.plan;
  return chosen;
}

}  // namespace refpool::c_api

extern "C" {

// ---- errors and version -------------------------------------------------------------------

const char* refpool_last_error(void) { return last_text; }

const char* refpool_status_name(refpool_status status) {
  switch (status) {
    case REFPOOL_OK: return "REFPOOL_OK";
    case REFPOOL_ERROR_USE_AFTER_FREE: return "REFPOOL_ERROR_USE_AFTER_FREE";
    case REFPOOL_ERROR_SHAPE: return "REFPOOL_ERROR_SHAPE";
    case REFPOOL_ERROR_SIZE: return "REFPOOL_ERROR_SIZE";
    case REFPOOL_ERROR_OUT_OF_MEMORY: return "REFPOOL_ERROR_OUT_OF_MEMORY";
    case REFPOOL_ERROR_BACKEND: return "REFPOOL_ERROR_BACKEND";
    case REFPOOL_ERROR_SCOPE: return "REFPOOL_ERROR_SCOPE";
    case REFPOOL_ERROR_CONFIG: return "REFPOOL_ERROR_CONFIG";
    case REFPOOL_ERROR_INVALID_ARGUMENT: return "REFPOOL_ERROR_INVALID_ARGUMENT";
    case REFPOOL_ERROR_INVALID_HANDLE: return "REFPOOL_ERROR_INVALID_HANDLE";
    case REFPOOL_ERROR_BACKEND_UNAVAILABLE: return "REFPOOL_ERROR_BACKEND_UNAVAILABLE";
    case REFPOOL_ERROR_INTERNAL: return "REFPOOL_ERROR_INTERNAL";
  }
  return "REFPOOL_UNKNOWN_STATUS";
}

const char* refpool_version(void) { return REFPOOL_VERSION; }

// ---- backends -----------------------------------------------------------------------------

refpool_status refpool_backend_host(refpool_backend* out) {
  return backend_handle(&refpool::host_backend, out, "refpool_backend_host");
}

refpool_status refpool_backend_new_host(refpool_backend* out) {
  return backend_handle(&refpool::make_host_backend, out, "refpool_backend_new_host");
}

refpool_status refpool_backend_new_host_limited(size_t capacity_bytes, refpool_backend* out) {
  return backend_handle(
      [&] {
        return refpool::backend(
            std::make_shared<refpool::limiting_resource>(refpool::make_host_resource(), capacity_bytes));
      },
      out, "refpool_backend_new_host_limited");
}

refpool_status refpool_backend_release(refpool_backend backend) {
  return guarded([&] { table_of<backend_object>().remove(backend.id, "refpool_backend_release"); });
}

refpool_status refpool_backend_get_stats(refpool_backend backend, refpool_backend_stats* out, size_t out_size) {
  return guarded([&] {
    const auto object = lookup<backend_object>(backend, "refpool_backend_get_stats");
    const refpool_backend_stats result{object->backend.outstanding_bytes(), object->backend.allocation_count(),
                                       object->backend.deallocation_count()};
    write_sized(result, out, out_size, "refpool_backend_get_stats", "refpool_backend_stats");
  });
}

// ---- caches -------------------------------------------------------------------------------

refpool_status refpool_cache_create(const refpool_cache_options* options, size_t options_size, refpool_cache* out) {
  return guarded([&] {
    refpool_cache& result = required(out, "refpool_cache_create", "out");
    const refpool::cache_options chosen = options == nullptr
                                              ? refpool::cache_options::from_environment()
                                              : from_c(read_options(options, options_size, "refpool_cache_create"));
    result = make_handle<refpool_cache>(std::make_shared<cache_object>(std::make_shared<refpool::alloc_cache>(chosen)));
  });
}

refpool_status refpool_cache_destroy(refpool_cache cache) {
  return guarded([&] { table_of<cache_object>().remove(cache.id, "refpool_cache_destroy"); });
}

refpool_status refpool_cache_get_stats(refpool_cache cache, refpool_cache_stats* out, size_t out_size) {
  return guarded([&] {
    const refpool::cache_stats s = lookup<cache_object>(cache, "refpool_cache_get_stats")->cache.stats();
    refpool_cache_stats result{};
#define REFPOOL_STATS_FIELD(type, name, description) result.name = s.name;
    REFPOOL_CACHE_STATS(REFPOOL_STATS_FIELD)
#undef REFPOOL_STATS_FIELD
    write_sized(result, out, out_size, "refpool_cache_get_stats", "refpool_cache_stats");
  });
}

refpool_status refpool_cache_reclaim(refpool_cache cache, size_t keep_bytes, size_t* freed_bytes) {
  return guarded([&] {
    const std::size_t freed = lookup<cache_object>(cache, "refpool_cache_reclaim")->cache.reclaim(keep_bytes);
    if (freed_bytes != nullptr) *freed_bytes = freed;
  });
}

refpool_status refpool_cache_set_max_idle_bytes(refpool_cache cache, size_t max_idle_bytes) {
  return guarded([&] {
    lookup<cache_object>(cache, "refpool_cache_set_max_idle_bytes")->cache.set_max_idle_bytes(max_idle_bytes);
  });
}

// ---- scopes -------------------------------------------------------------------------------

refpool_status refpool_scope_enter(refpool_cache cache, refpool_scope* out) {
  return enter_scope(cache, nullptr, 0, out, "refpool_scope_enter");
}

refpool_status refpool_scope_enter_with_options(refpool_cache cache, const refpool_scope_options* options,
                                                size_t options_size, refpool_scope* out) {
  return enter_scope(cache, options, options_size, out, "refpool_scope_enter_with_options");
}

refpool_status refpool_scope_exit(refpool_scope scope) {
  return guarded([&] {
    auto& table = table_of<scope_object>();
    const auto object = table.get(scope.id, "refpool_scope_exit");
    std::lock_guard guard(object->mutex);
    object->scope.close();  // throws scope_error (handle kept) when out of order or on another thread
    table.remove(scope.id, "refpool_scope_exit");  // throws if a racing exit removed it first
  });
}

// ---- buffers ------------------------------------------------------------------------------

refpool_status refpool_alloc(refpool_backend backend, const size_t* dims, size_t rank, size_t element_size,
                             const refpool_alloc_options* options, size_t options_size, refpool_buffer* out) {
  return guarded([&] {
    refpool_buffer& result = required(out, "refpool_alloc", "out");
    if (element_size == 0) fail(REFPOOL_ERROR_INVALID_ARGUMENT, "refpool: refpool_alloc: element_size is 0");
    const refpool_alloc_options chosen =
        options != nullptr
            ? read_sized(options, options_size, refpool_alloc_options{}, "refpool_alloc", "refpool_alloc_options")
            : refpool_alloc_options{};
    const auto be = lookup<backend_object>(backend, "refpool_alloc");
    check_alignment(chosen.alignment, be->backend);
    refpool::shape shape = dims_from(dims, rank, "refpool_alloc");
    const std::size_t bytes = refpool::detail::checked_bytes(shape, element_size);
    const refpool::stream_ref stream{chosen.stream};
    refpool::data_ref ref;  // 0 bytes: a null handle
    if (chosen.cache.id != 0) {
      ref = lookup<cache_object>(chosen.cache, "refpool_alloc")->cache.allocate(be->backend, bytes, stream);
    } else {
      ref = refpool::allocate(be->backend, bytes, stream);
    }
    result = new_buffer(std::move(ref), std::move(shape), element_size, bytes / element_size);
  });
}

refpool_status refpool_reshape(refpool_buffer buffer, const size_t* dims, size_t rank, refpool_buffer* out) {
  return guarded([&] {
    refpool_buffer& result = required(out, "refpool_reshape", "out");
    const auto object = lookup<buffer_object>(buffer, "refpool_reshape");
    refpool::shape shape = dims_from(dims, rank, "refpool_reshape");
    std::lock_guard guard(object->mutex);
    if (shape.element_count() != object->element_count)
      refpool::detail::throw_reshape_error(object->dims, object->element_size, shape, object->element_size);
    result = new_buffer(object->ref, std::move(shape), object->element_size, object->element_count);
  });
}

refpool_status refpool_retain(refpool_buffer buffer, refpool_buffer* out) {
  return guarded([&] {
    refpool_buffer& result = required(out, "refpool_retain", "out");
    const auto object = lookup<buffer_object>(buffer, "refpool_retain");
    std::lock_guard guard(object->mutex);
    result = new_buffer(object->ref, object->dims, object->element_size, object->element_count);
  });
}

refpool_status refpool_release(refpool_buffer buffer) {
  return guarded([&] { table_of<buffer_object>().remove(buffer.id, "refpool_release"); });
}

refpool_status refpool_unsafe_free(refpool_buffer buffer) {
  return guarded([&] {
    const auto object = lookup<buffer_object>(buffer, "refpool_unsafe_free");
    std::lock_guard guard(object->mutex);
    object->ref.unsafe_free();
  });
}

refpool_status refpool_use_count(refpool_buffer buffer, long* out) {
  return guarded([&] {
    long& result = required(out, "refpool_use_count", "out");
    const auto object = lookup<buffer_object>(buffer, "refpool_use_count");
    std::lock_guard guard(object->mutex);
    result = object->ref.use_count();
  });
}

refpool_status refpool_data(refpool_buffer buffer, void** out) {
  return guarded([&] {
    void*& result = required(out, "refpool_data", "out");
    const auto object = lookup<buffer_object>(buffer, "refpool_data");
    std::lock_guard guard(object->mutex);
    result = object->ref.data();
  });
}

refpool_status refpool_dims(refpool_buffer buffer, size_t* dims, size_t capacity, size_t* rank) {
  return guarded([&] {
    std::size_t& rank_out = required(rank, "refpool_dims", "rank");
    const auto object = lookup<buffer_object>(buffer, "refpool_dims");
    std::lock_guard guard(object->mutex);
    const refpool::shape& shape = object->dims;
    rank_out = shape.rank();
    if (dims == nullptr) return;
    if (capacity < shape.rank())
      fail(REFPOOL_ERROR_INVALID_ARGUMENT,
           fmt::format("refpool: refpool_dims: the buffer has rank {} but dims has room for {}", shape.rank(),
                       capacity));
    std::copy(shape.begin(), shape.end(), dims);
  });
}

refpool_status refpool_buffer_get_info(refpool_buffer buffer, refpool_buffer_info* out, size_t out_size) {
  return guarded([&] {
    const auto object = lookup<buffer_object>(buffer, "refpool_buffer_get_info");
    refpool_buffer_info result;
    std::memset(&result, 0, sizeof result);  // its padding too: all of it is copied out
    {
      std::lock_guard guard(object->mutex);
      result.rank = object->dims.rank();
      result.element_count = object->element_count;
      result.element_size = object->element_size;
      result.bytes = object->element_count * object->element_size;
      result.is_freed = object->ref.is_freed() ? 1 : 0;
    }
    write_sized(result, out, out_size, "refpool_buffer_get_info", "refpool_buffer_info");
  });
}

}  // extern "C"
