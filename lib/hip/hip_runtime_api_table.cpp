// Fills the shared GPU runtime table with thin wrappers over the loaded HIP runtime.
#include <cstdint>

#include "runtime.hpp"

namespace refpool::detail::hip {

namespace {

using gpu::handle;
using gpu::status;

hipStream_t as_stream(handle h) { return static_cast<hipStream_t>(h); }
hipEvent_t as_event(handle h) { return static_cast<hipEvent_t>(h); }
// HIP's current device is an ordinal; the shared table saves it in a handle.
handle as_handle(int device) { return reinterpret_cast<handle>(static_cast<std::intptr_t>(device)); }
int as_device(handle h) { return static_cast<int>(reinterpret_cast<std::intptr_t>(h)); }

status activate(int device, handle* saved) {
  check_device(device);
  int current = 0;
  if (const hipError_t r = call(runtime().hipGetDevice, &current); r != hipSuccess) return r;
  *saved = as_handle(current);
  return current == device ? hipSuccess : call(runtime().hipSetDevice, device);
}

status restore(handle saved) {
  int current = 0;
  if (const hipError_t r = call(runtime().hipGetDevice, &current); r != hipSuccess) return r;
  return current == as_device(saved) ? hipSuccess : call(runtime().hipSetDevice, as_device(saved));
}

status mem_alloc(void** ptr, std::size_t bytes) { return call(runtime().hipMalloc, ptr, bytes); }
status mem_free(void* ptr) { return call(runtime().hipFree, ptr); }
status mem_alloc_async(void** ptr, std::size_t bytes, handle stream) {
  return call(runtime().hipMallocAsync, ptr, bytes, as_stream(stream));
}
status mem_free_async(void* ptr, handle stream) { return call(runtime().hipFreeAsync, ptr, as_stream(stream)); }
status host_alloc(void** ptr, std::size_t bytes) { return call(runtime().hipHostMalloc, ptr, bytes, hipHostMallocPortable); }
status host_free(void* ptr) { return call(runtime().hipHostFree, ptr); }
status event_create(handle* event) {
  return call(runtime().hipEventCreateWithFlags, reinterpret_cast<hipEvent_t*>(event), hipEventDisableTiming);
}
status event_destroy(handle event) { return call(runtime().hipEventDestroy, as_event(event)); }
status event_record(handle event, handle stream) { return call(runtime().hipEventRecord, as_event(event), as_stream(stream)); }
status stream_wait_event(handle stream, handle event) {
  return call(runtime().hipStreamWaitEvent, as_stream(stream), as_event(event), 0);
}
const char* error_name(status code) { return runtime().hipGetErrorName(static_cast<hipError_t>(code)); }
const char* error_string(status code) { return runtime().hipGetErrorString(static_cast<hipError_t>(code)); }

const gpu::runtime_api table = {
    .runtime = "HIP",
    .success = hipSuccess,
    .out_of_memory = hipErrorOutOfMemory,
    .activate = activate,
    .restore = restore,
    .mem_alloc = mem_alloc,
    .mem_free = mem_free,
    .mem_alloc_async = mem_alloc_async,
    .mem_free_async = mem_free_async,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .stream_wait_event = stream_wait_event,
    .error_name = error_name,
    .error_string = error_string,
    .torn_down = process_exiting,
};

}  // namespace

const gpu::runtime_api& runtime_table() { return table; }

}  // namespace refpool::detail::hip
