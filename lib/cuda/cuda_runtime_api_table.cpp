// Fills the shared GPU runtime table with thin wrappers over the loaded driver API.
#include "cuda_runtime_api_table.hpp"

#include "driver.hpp"

namespace refpool::detail::cuda {

namespace {

using gpu::handle;
using gpu::status;

CUstream as_stream(handle h) { return static_cast<CUstream>(h); }
CUdeviceptr as_device_ptr(void* p) { return reinterpret_cast<CUdeviceptr>(p); }

status activate(int device, handle* saved) {
  CUcontext wanted = context(device);
  CUcontext current = nullptr;
  if (const CUresult r = driver().cuCtxGetCurrent(&current); r != CUDA_SUCCESS) return r;
  *saved = current;
  return current == wanted ? CUDA_SUCCESS : driver().cuCtxSetCurrent(wanted);
}

status restore(handle saved) {
  CUcontext current = nullptr;
  driver().cuCtxGetCurrent(&current);
  return current == saved ? CUDA_SUCCESS : driver().cuCtxSetCurrent(static_cast<CUcontext>(saved));
}

status mem_alloc(void** ptr, std::size_t bytes) {
  CUdeviceptr p = 0;
  const CUresult r = driver().cuMemAlloc(&p, bytes);
  *ptr = reinterpret_cast<void*>(p);
  return r;
}
status mem_free(void* ptr) { return driver().cuMemFree(as_device_ptr(ptr)); }
status mem_alloc_async(void** ptr, std::size_t bytes, handle stream) {
  CUdeviceptr p = 0;
  const CUresult r = driver().cuMemAllocAsync(&p, bytes, as_stream(stream));
  *ptr = reinterpret_cast<void*>(p);
  return r;
}
status mem_free_async(void* ptr, handle stream) { return driver().cuMemFreeAsync(as_device_ptr(ptr), as_stream(stream)); }
status host_alloc(void** ptr, std::size_t bytes) { return driver().cuMemHostAlloc(ptr, bytes, CU_MEMHOSTALLOC_PORTABLE); }
status host_free(void* ptr) { return driver().cuMemFreeHost(ptr); }
status event_create(handle* event) {
  return driver().cuEventCreate(reinterpret_cast<CUevent*>(event), CU_EVENT_DISABLE_TIMING);
}
status event_destroy(handle event) { return driver().cuEventDestroy(static_cast<CUevent>(event)); }
status event_record(handle event, handle stream) {
  return driver().cuEventRecord(static_cast<CUevent>(event), as_stream(stream));
}
status stream_wait_event(handle stream, handle event) {
  return driver().cuStreamWaitEvent(as_stream(stream), static_cast<CUevent>(event), 0);
}
const char* error_name(status code) {
  const char* name = nullptr;
  driver().cuGetErrorName(static_cast<CUresult>(code), &name);
  return name;
}
const char* error_string(status code) {
  const char* text = nullptr;
  driver().cuGetErrorString(static_cast<CUresult>(code), &text);
  return text;
}

const gpu::runtime_api table = {
    .runtime = "CUDA",
    .success = CUDA_SUCCESS,
    .out_of_memory = CUDA_ERROR_OUT_OF_MEMORY,
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
};

}  // namespace

const gpu::runtime_api& runtime_table() { return table; }

}  // namespace refpool::detail::cuda
