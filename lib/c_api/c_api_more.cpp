// The C API for GPU code and bindings: GPU backends and streams, raw pointers freed by address,
// steps, counters by name, and the stats as text for people.
#include <refpool/cuda.hpp>
#include <refpool/hip.hpp>
#include <refpool/pointer.hpp>

#include <cstring>
#include <string>

#include "c_api/support.hpp"

using namespace refpool::c_api;

namespace {

refpool::memory_kind gpu_kind(refpool_memory_kind kind, const char* function) {
  switch (kind) {
    case REFPOOL_MEMORY_DEVICE: return refpool::memory_kind::device;
    case REFPOOL_MEMORY_DEVICE_ASYNC: return refpool::memory_kind::device_async;
    case REFPOOL_MEMORY_PINNED_HOST: return refpool::memory_kind::pinned_host;
    case REFPOOL_MEMORY_HOST: break;
  }
  fail(REFPOOL_ERROR_INVALID_ARGUMENT,
       fmt::format("refpool: {}: memory kind {} is not a GPU kind (REFPOOL_MEMORY_DEVICE 1, _DEVICE_ASYNC 2, "
                   "_PINNED_HOST 3; host memory is refpool_backend_host)",
                   function, static_cast<int>(kind)));
}

refpool::stream_ref stream_of(void* stream) { return refpool::stream_ref{stream}; }

}  // namespace

extern "C" {

// ---- GPU backends and streams -------------------------------------------------------------

refpool_status refpool_backend_cuda(int device, refpool_memory_kind kind, refpool_backend* out) {
  return backend_handle([&] { return refpool::cuda::device(device, gpu_kind(kind, "refpool_backend_cuda")); }, out,
                        "refpool_backend_cuda", REFPOOL_RUNTIME_CUDA);
}

refpool_status refpool_backend_hip(int device, refpool_memory_kind kind, refpool_backend* out) {
  return backend_handle([&] { return refpool::hip::device(device, gpu_kind(kind, "refpool_backend_hip")); }, out,
                        "refpool_backend_hip", REFPOOL_RUNTIME_HIP);
}

refpool_status refpool_record_stream(refpool_buffer buffer, void* stream) {
  return guarded([&] {
    const auto object = lookup<buffer_object>(buffer, "refpool_record_stream");
    std::lock_guard guard(object->mutex);
    object->ref.record_stream(stream_of(stream));
  });
}

refpool_status refpool_retire_stream(refpool_backend backend, void* stream) {
  return guarded([&] {
    const auto object = lookup<backend_object>(backend, "refpool_retire_stream");
    const int device = object->backend.device();
    if (object->runtime == REFPOOL_RUNTIME_CUDA) refpool::cuda::retire_stream(stream_of(stream), device);
    if (object->runtime == REFPOOL_RUNTIME_HIP) refpool::hip::retire_stream(stream_of(stream), device);
  });
}

// ---- free by pointer ----------------------------------------------------------------------

refpool_status refpool_free(void* ptr) {
  return guarded([&] { refpool::free_pointer(ptr); });
}

// ---- steps --------------------------------------------------------------------------------

refpool_status refpool_step_begin(refpool_cache cache, const refpool_scope_options* options, size_t options_size,
                                  refpool_step* out) {
  return guarded([&] {
    refpool_step& result = required(out, "refpool_step_begin", "out");
    const auto object = lookup<cache_object>(cache, "refpool_step_begin");
    const refpool::scope_options chosen = scope_options_from(options, options_size, "refpool_step_begin");
    auto begun = std::make_shared<step_object>(object->cache, chosen, object->owner);
    result = make_handle<refpool_step>(std::move(begun));
  });
}

refpool_status refpool_step_end(refpool_step step) {
  return guarded([&] {
    const auto object = table_of<step_object>().remove(step.id, "refpool_step_end");
    object->step.end();
  });
}

// ---- stats by name ------------------------------------------------------------------------

size_t refpool_stat_count(void) { return refpool::stat_count(); }

const char* refpool_stat_name(size_t index) {
  return index < refpool::stat_count() ? refpool::stat_at(index).name.data() : nullptr;
}

const char* refpool_stat_description(size_t index) {
  return index < refpool::stat_count() ? refpool::stat_at(index).description.data() : nullptr;
}

refpool_status refpool_cache_get_stat_values(refpool_cache cache, uint64_t* values, size_t capacity, size_t* count) {
  return guarded([&] {
    std::size_t& total = required(count, "refpool_cache_get_stat_values", "count");
    if (values == nullptr && capacity > 0)
      fail(REFPOOL_ERROR_INVALID_ARGUMENT,
           "refpool: refpool_cache_get_stat_values: values is NULL but capacity is not 0");
    const refpool::cache_stats s = lookup<cache_object>(cache, "refpool_cache_get_stat_values")->cache.stats();
    for (std::size_t i = 0; i < refpool::stat_count() && i < capacity; ++i) values[i] = refpool::stat_value(s, i);
    total = refpool::stat_count();
  });
}

refpool_status refpool_cache_reset_peaks(refpool_cache cache) {
  return guarded([&] { lookup<cache_object>(cache, "refpool_cache_reset_peaks")->cache.reset_peaks(); });
}

// ---- stats for people ---------------------------------------------------------------------

refpool_status refpool_cache_summary(refpool_cache cache, refpool_summary_detail detail, char* text, size_t capacity,
                                     size_t* length) {
  return guarded([&] {
    std::size_t& text_length = required(length, "refpool_cache_summary", "length");
    if (text == nullptr && capacity > 0)
      fail(REFPOOL_ERROR_INVALID_ARGUMENT, "refpool: refpool_cache_summary: text is NULL but capacity is not 0");
    if (detail != REFPOOL_SUMMARY_SHORT && detail != REFPOOL_SUMMARY_FULL)
      fail(REFPOOL_ERROR_INVALID_ARGUMENT,
           fmt::format("refpool: refpool_cache_summary: detail is {}; allowed: REFPOOL_SUMMARY_SHORT (0), "
                       "REFPOOL_SUMMARY_FULL (1)",
                       static_cast<int>(detail)));
    const refpool::cache_stats s = lookup<cache_object>(cache, "refpool_cache_summary")->cache.stats();
    const std::string made = detail == REFPOOL_SUMMARY_SHORT ? refpool::summary(s) : refpool::to_string(s);
    text_length = made.size();  // also when text is too small: the caller sizes its buffer from it
    if (text == nullptr) return;
    if (capacity <= made.size())
      fail(REFPOOL_ERROR_INVALID_ARGUMENT,
           fmt::format("refpool: refpool_cache_summary: the text has {} bytes and a NUL, but text has room for {}",
                       made.size(), capacity));
    std::memcpy(text, made.data(), made.size());
    text[made.size()] = '\0';
  });
}

}  // extern "C"
