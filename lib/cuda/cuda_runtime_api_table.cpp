// The CUDA driver's entries in the shared GPU runtime table: thin wrappers over the loaded driver.
#include <cstdint>

#include <fmt/format.h>

#include "../gpu/runtime_api.hpp"
#include "driver.hpp"

namespace refpool::detail::cuda {

namespace {

using gpu::handle;
using gpu::status;

CUstream as_stream(handle h) { return static_cast<CUstream>(h); }
CUdeviceptr as_device_ptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

std::string kind_unavailable(memory_kind) { return {}; }  // CUDA 12 serves every kind
bool torn_down() noexcept { return false; }               // the driver reports calls after its teardown as errors
bool context_gone(status code) noexcept {
  return code == CUDA_ERROR_DEINITIALIZED || code == CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

constexpr std::string_view activate_call = "cuCtxSetCurrent";
status activate(int device, handle* saved) {
  CUcontext wanted = context(device);
  CUcontext current = nullptr;
  if (const CUresult r = driver().cuCtxGetCurrent(&current); r != CUDA_SUCCESS) return r;
  *saved = current;
  return current == wanted ? CUDA_SUCCESS : driver().cuCtxSetCurrent(wanted);
}

constexpr std::string_view restore_call = "cuCtxSetCurrent";
status restore(handle saved) {
  CUcontext current = nullptr;
  driver().cuCtxGetCurrent(&current);
  return current == saved ? CUDA_SUCCESS : driver().cuCtxSetCurrent(static_cast<CUcontext>(saved));
}

constexpr std::string_view driver_version_call = "cuDriverGetVersion";
status driver_version(int* version) {
  *version = driver().version;
  return CUDA_SUCCESS;
}

constexpr std::string_view device_name_call = "cuDeviceGetName";
status device_name(int ordinal, char* name, std::size_t size) {
  CUdevice device = 0;
  if (const CUresult r = driver().cuDeviceGet(&device, ordinal); r != CUDA_SUCCESS) return r;
  return driver().cuDeviceGetName(name, static_cast<int>(size), device);
}

constexpr std::string_view memory_info_call = "cuMemGetInfo";
status memory_info(std::size_t* free, std::size_t* total) { return driver().cuMemGetInfo(free, total); }

constexpr std::string_view keep_pool_memory_call = "cuMemPoolSetAttribute";
status keep_pool_memory(int ordinal) {
  CUdevice device = 0;
  CUmemoryPool pool = nullptr;
  if (const CUresult r = driver().cuDeviceGet(&device, ordinal); r != CUDA_SUCCESS) return r;
  if (const CUresult r = driver().cuDeviceGetDefaultMemPool(&pool, device); r != CUDA_SUCCESS) return r;
  cuuint64_t threshold = ~cuuint64_t{0};
  return driver().cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
}

constexpr std::string_view mem_alloc_call = "cuMemAlloc";
status mem_alloc(void** ptr, std::size_t bytes) {
  CUdeviceptr p = 0;
  const CUresult r = driver().cuMemAlloc(&p, bytes);
  *ptr = reinterpret_cast<void*>(p);
  return r;
}
constexpr std::string_view mem_free_call = "cuMemFree";
status mem_free(void* ptr) { return driver().cuMemFree(as_device_ptr(ptr)); }
constexpr std::string_view mem_alloc_async_call = "cuMemAllocAsync";
status mem_alloc_async(void** ptr, std::size_t bytes, handle stream) {
  CUdeviceptr p = 0;
  const CUresult r = driver().cuMemAllocAsync(&p, bytes, as_stream(stream));
  *ptr = reinterpret_cast<void*>(p);
  return r;
}
constexpr std::string_view mem_free_async_call = "cuMemFreeAsync";
status mem_free_async(void* ptr, handle stream) {
  return driver().cuMemFreeAsync(as_device_ptr(ptr), as_stream(stream));
}
constexpr std::string_view host_alloc_call = "cuMemHostAlloc";
status host_alloc(void** ptr, std::size_t bytes) {
  return driver().cuMemHostAlloc(ptr, bytes, CU_MEMHOSTALLOC_PORTABLE);
}
constexpr std::string_view host_free_call = "cuMemFreeHost";
status host_free(void* ptr) { return driver().cuMemFreeHost(ptr); }

constexpr std::string_view event_create_call = "cuEventCreate";
status event_create(handle* event) {
  return driver().cuEventCreate(reinterpret_cast<CUevent*>(event), CU_EVENT_DISABLE_TIMING);
}
constexpr std::string_view event_destroy_call = "cuEventDestroy";
status event_destroy(handle event) { return driver().cuEventDestroy(static_cast<CUevent>(event)); }
constexpr std::string_view event_record_call = "cuEventRecord";
status event_record(handle event, handle stream) {
  return driver().cuEventRecord(static_cast<CUevent>(event), as_stream(stream));
}
constexpr std::string_view stream_wait_event_call = "cuStreamWaitEvent";
status stream_wait_event(handle stream, handle event) {
  return driver().cuStreamWaitEvent(as_stream(stream), static_cast<CUevent>(event), 0);
}
constexpr std::string_view stream_create_call = "cuStreamCreate";
status stream_create(handle* stream) {
  return driver().cuStreamCreate(reinterpret_cast<CUstream*>(stream), CU_STREAM_NON_BLOCKING);
}
constexpr std::string_view stream_destroy_call = "cuStreamDestroy";
status stream_destroy(handle stream) { return driver().cuStreamDestroy(as_stream(stream)); }
constexpr std::string_view stream_synchronize_call = "cuStreamSynchronize";
status stream_synchronize(handle stream) { return driver().cuStreamSynchronize(as_stream(stream)); }
constexpr std::string_view stream_capture_call = "cuStreamGetCaptureInfo";
status stream_capture(handle stream, gpu::capture_status* capture, unsigned long long* id) {
  CUstreamCaptureStatus native = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t native_id = 0;
  const CUresult r = driver().cuStreamGetCaptureInfo(as_stream(stream), &native, &native_id, nullptr, nullptr, nullptr);
  *capture = native == CU_STREAM_CAPTURE_STATUS_ACTIVE        ? gpu::capture_status::active
             : native == CU_STREAM_CAPTURE_STATUS_INVALIDATED ? gpu::capture_status::invalidated
                                                              : gpu::capture_status::none;
  *id = native_id;
  return r;
}
constexpr std::string_view exchange_capture_mode_call = "cuThreadExchangeStreamCaptureMode";
status exchange_capture_mode(gpu::capture_mode* mode) {
  CUstreamCaptureMode native = *mode == gpu::capture_mode::relaxed      ? CU_STREAM_CAPTURE_MODE_RELAXED
                               : *mode == gpu::capture_mode::per_thread ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                                                                        : CU_STREAM_CAPTURE_MODE_GLOBAL;
  const CUresult r = driver().cuThreadExchangeStreamCaptureMode(&native);
  *mode = native == CU_STREAM_CAPTURE_MODE_RELAXED        ? gpu::capture_mode::relaxed
          : native == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ? gpu::capture_mode::per_thread
                                                          : gpu::capture_mode::global;
  return r;
}
constexpr std::string_view device_synchronize_call = "cuCtxSynchronize";
status device_synchronize() { return driver().cuCtxSynchronize(); }

constexpr std::string_view copy_call = "cuMemcpyAsync";
status copy(void* dst, const void* src, std::size_t bytes, handle stream) {
  return driver().cuMemcpyAsync(as_device_ptr(dst), as_device_ptr(src), bytes, as_stream(stream));
}
constexpr std::string_view fill_call = "cuMemsetD8Async";
status fill(void* dst, unsigned char value, std::size_t bytes, handle stream) {
  return driver().cuMemsetD8Async(as_device_ptr(dst), value, bytes, as_stream(stream));
}
constexpr std::string_view copy_peer_call = "cuMemcpyPeerAsync";
status copy_peer(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes, handle stream) {
  return driver().cuMemcpyPeerAsync(as_device_ptr(dst), context(dst_device), as_device_ptr(src), context(src_device),
                                    bytes, as_stream(stream));
}

// Virtual memory: device memory pinned to one device, readable and writable by it.
CUmemAllocationProp pinned_to(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}
CUmemGenericAllocationHandle as_physical(handle h) {
  return static_cast<CUmemGenericAllocationHandle>(reinterpret_cast<std::uintptr_t>(h));
}

constexpr std::string_view vm_supported_call = "cuDeviceGetAttribute";
status vm_supported(int ordinal, bool* supported) {
  CUdevice device = 0;
  int value = 0;
  if (const CUresult r = driver().cuDeviceGet(&device, ordinal); r != CUDA_SUCCESS) return r;
  const CUresult r =
      driver().cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
  *supported = value != 0;
  return r;
}
constexpr std::string_view vm_granularity_call = "cuMemGetAllocationGranularity";
status vm_granularity(int device, std::size_t* granularity) {
  const CUmemAllocationProp prop = pinned_to(device);
  return driver().cuMemGetAllocationGranularity(granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}
constexpr std::string_view vm_reserve_call = "cuMemAddressReserve";
status vm_reserve(void** ptr, std::size_t bytes, std::size_t alignment) {
  CUdeviceptr p = 0;
  const CUresult r = driver().cuMemAddressReserve(&p, bytes, alignment, 0, 0);
  *ptr = reinterpret_cast<void*>(p);
  return r;
}
constexpr std::string_view vm_free_call = "cuMemAddressFree";
status vm_free(void* ptr, std::size_t bytes) { return driver().cuMemAddressFree(as_device_ptr(ptr), bytes); }
constexpr std::string_view vm_create_call = "cuMemCreate";
status vm_create(handle* physical, std::size_t bytes, int device) {
  const CUmemAllocationProp prop = pinned_to(device);
  CUmemGenericAllocationHandle h = 0;
  const CUresult r = driver().cuMemCreate(&h, bytes, &prop, 0);
  *physical = reinterpret_cast<handle>(static_cast<std::uintptr_t>(h));
  return r;
}
constexpr std::string_view vm_release_call = "cuMemRelease";
status vm_release(handle physical) { return driver().cuMemRelease(as_physical(physical)); }
constexpr std::string_view vm_map_call = "cuMemMap";
status vm_map(void* ptr, std::size_t bytes, handle physical) {
  return driver().cuMemMap(as_device_ptr(ptr), bytes, 0, as_physical(physical), 0);
}
constexpr std::string_view vm_unmap_call = "cuMemUnmap";
status vm_unmap(void* ptr, std::size_t bytes) { return driver().cuMemUnmap(as_device_ptr(ptr), bytes); }
constexpr std::string_view vm_set_access_call = "cuMemSetAccess";
status vm_set_access(void* ptr, std::size_t bytes, int device) {
  CUmemAccessDesc access{};
  access.location = pinned_to(device).location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return driver().cuMemSetAccess(as_device_ptr(ptr), bytes, &access, 1);
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

}  // namespace

const gpu::runtime_api& table() {
  static const gpu::runtime_api instance = REFPOOL_GPU_TABLE("CUDA", "cuda", CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY);
  return instance;
}

}  // namespace refpool::detail::cuda
