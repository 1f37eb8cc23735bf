// The HIP runtime's entries in the shared GPU runtime table: thin wrappers over the loaded runtime,
// each through call() (runtime.hpp), plus what particular releases need (docs/hip.md).
#include <cstdint>

#include <fmt/format.h>

#include "../gpu/runtime_api.hpp"
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

constexpr std::string_view activate_call = "hipSetDevice";
status activate(int device, handle* saved) {
  int current = 0;
  if (const hipError_t r = call(runtime().hipGetDevice, &current); r != hipSuccess) return r;
  *saved = as_handle(current);
  return current == device ? hipSuccess : call(runtime().hipSetDevice, device);
}

constexpr std::string_view restore_call = "hipSetDevice";
status restore(handle saved) {
  int current = 0;
  if (const hipError_t r = call(runtime().hipGetDevice, &current); r != hipSuccess) return r;
  return current == as_device(saved) ? hipSuccess : call(runtime().hipSetDevice, as_device(saved));
}

constexpr std::string_view driver_version_call = "hipDriverGetVersion";
status driver_version(int* version) { return call(runtime().hipDriverGetVersion, version); }

constexpr std::string_view device_name_call = "hipDeviceGetName";
status device_name(int ordinal, char* name, std::size_t size) {
  hipDevice_t device = 0;
  if (const hipError_t r = call(runtime().hipDeviceGet, &device, ordinal); r != hipSuccess) return r;
  return call(runtime().hipDeviceGetName, name, static_cast<int>(size), device);
}

constexpr std::string_view memory_info_call = "hipMemGetInfo";
status memory_info(std::size_t* free, std::size_t* total) { return call(runtime().hipMemGetInfo, free, total); }

constexpr std::string_view keep_pool_memory_call = "hipMemPoolSetAttribute";
status keep_pool_memory(int device) {
  hipMemPool_t pool = nullptr;
  if (const hipError_t r = call(runtime().hipDeviceGetDefaultMemPool, &pool, device); r != hipSuccess) return r;
  std::uint64_t threshold = ~std::uint64_t{0};
  return call(runtime().hipMemPoolSetAttribute, pool, hipMemPoolAttrReleaseThreshold, &threshold);
}

// Once the process is exiting, the runtime may be gone (runtime.hpp, process_exiting).
bool torn_down() noexcept { return process_exiting(); }
bool context_gone(status code) noexcept { return code == hipErrorDeinitialized || code == hipErrorContextIsDestroyed; }

// HIP 5.2's hipMallocAsync and hipFreeAsync crash on the default stream (docs/hip.md, finding 1).
std::string kind_unavailable(memory_kind kind) {
  if (kind != memory_kind::device_async || runtime().version >= minimum_async_version) return {};
  return fmt::format(
      "HIP stream-ordered memory (memory_kind::device_async) needs HIP {} or newer: the HIP {} of {} "
      "crashes in hipMallocAsync on the default stream; use memory_kind::device",
      version_text(minimum_async_version), version_text(runtime().version), runtime().library);
}

constexpr std::string_view mem_alloc_call = "hipMalloc";
status mem_alloc(void** ptr, std::size_t bytes) { return call(runtime().hipMalloc, ptr, bytes); }
constexpr std::string_view mem_free_call = "hipFree";
status mem_free(void* ptr) { return call(runtime().hipFree, ptr); }
constexpr std::string_view mem_alloc_async_call = "hipMallocAsync";
status mem_alloc_async(void** ptr, std::size_t bytes, handle stream) {
  return call(runtime().hipMallocAsync, ptr, bytes, as_stream(stream));
}
constexpr std::string_view mem_free_async_call = "hipFreeAsync";
status mem_free_async(void* ptr, handle stream) { return call(runtime().hipFreeAsync, ptr, as_stream(stream)); }
constexpr std::string_view host_alloc_call = "hipHostMalloc";
status host_alloc(void** ptr, std::size_t bytes) {
  return call(runtime().hipHostMalloc, ptr, bytes, hipHostMallocPortable);
}
constexpr std::string_view host_free_call = "hipHostFree";
status host_free(void* ptr) { return call(runtime().hipHostFree, ptr); }

constexpr std::string_view event_create_call = "hipEventCreateWithFlags";
status event_create(handle* event) {
  return call(runtime().hipEventCreateWithFlags, reinterpret_cast<hipEvent_t*>(event), hipEventDisableTiming);
}
constexpr std::string_view event_destroy_call = "hipEventDestroy";
status event_destroy(handle event) { return call(runtime().hipEventDestroy, as_event(event)); }
constexpr std::string_view event_record_call = "hipEventRecord";
status event_record(handle event, handle stream) {
  return call(runtime().hipEventRecord, as_event(event), as_stream(stream));
}
constexpr std::string_view stream_wait_event_call = "hipStreamWaitEvent";
status stream_wait_event(handle stream, handle event) {
  return call(runtime().hipStreamWaitEvent, as_stream(stream), as_event(event), 0u);
}
constexpr std::string_view stream_create_call = "hipStreamCreateWithFlags";
status stream_create(handle* stream) {
  return call(runtime().hipStreamCreateWithFlags, reinterpret_cast<hipStream_t*>(stream), hipStreamNonBlocking);
}
constexpr std::string_view stream_destroy_call = "hipStreamDestroy";
status stream_destroy(handle stream) { return call(runtime().hipStreamDestroy, as_stream(stream)); }
constexpr std::string_view stream_synchronize_call = "hipStreamSynchronize";
status stream_synchronize(handle stream) { return call(runtime().hipStreamSynchronize, as_stream(stream)); }
constexpr std::string_view stream_capture_call = "hipStreamGetCaptureInfo";
status stream_capture(handle stream, gpu::capture_status* capture, unsigned long long* id) {
  hipStreamCaptureStatus native = hipStreamCaptureStatusNone;
  const status r = call(runtime().hipStreamGetCaptureInfo, as_stream(stream), &native, id);
  *capture = native == hipStreamCaptureStatusActive        ? gpu::capture_status::active
             : native == hipStreamCaptureStatusInvalidated ? gpu::capture_status::invalidated
                                                           : gpu::capture_status::none;
  return r;
}
constexpr std::string_view exchange_capture_mode_call = "hipThreadExchangeStreamCaptureMode";
status exchange_capture_mode(gpu::capture_mode* mode) {
  hipStreamCaptureMode native = *mode == gpu::capture_mode::relaxed      ? hipStreamCaptureModeRelaxed
                                : *mode == gpu::capture_mode::per_thread ? hipStreamCaptureModeThreadLocal
                                                                         : hipStreamCaptureModeGlobal;
  const status r = call(runtime().hipThreadExchangeStreamCaptureMode, &native);
  *mode = native == hipStreamCaptureModeRelaxed       ? gpu::capture_mode::relaxed
          : native == hipStreamCaptureModeThreadLocal ? gpu::capture_mode::per_thread
                                                      : gpu::capture_mode::global;
  return r;
}
constexpr std::string_view device_synchronize_call = "hipDeviceSynchronize";
status device_synchronize() { return call(runtime().hipDeviceSynchronize); }

constexpr std::string_view copy_call = "hipMemcpyAsync";
status copy(void* dst, const void* src, std::size_t bytes, handle stream) {
  return call(runtime().hipMemcpyAsync, dst, src, bytes, hipMemcpyDefault, as_stream(stream));
}
constexpr std::string_view fill_call = "hipMemsetAsync";
status fill(void* dst, unsigned char value, std::size_t bytes, handle stream) {
  return call(runtime().hipMemsetAsync, dst, static_cast<int>(value), bytes, as_stream(stream));
}
constexpr std::string_view copy_peer_call = "hipMemcpyPeerAsync";
status copy_peer(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes, handle stream) {
  return call(runtime().hipMemcpyPeerAsync, dst, dst_device, src, src_device, bytes, as_stream(stream));
}

// Virtual memory: device memory pinned to one device, readable and writable by it; from HIP 5.3.
allocation_prop_53 pinned_to(int device) {
  allocation_prop_53 prop{};
  prop.type = hipMemAllocationTypePinned;
  prop.location = {hipMemLocationTypeDevice, device};
  return prop;
}

constexpr std::string_view vm_supported_call = "hipDeviceGetAttribute";
status vm_supported(int device, bool* supported) {
  const runtime_api& api = runtime();
  *supported = false;
  if (api.version < minimum_vm_version || api.hipDeviceGetAttribute == nullptr || api.hipMemCreate == nullptr ||
      api.hipMemGetAllocationGranularity == nullptr || api.hipMemAddressReserve == nullptr ||
      api.hipMemAddressFree == nullptr || api.hipMemRelease == nullptr || api.hipMemMap == nullptr ||
      api.hipMemUnmap == nullptr || api.hipMemSetAccess == nullptr)
    return hipSuccess;
  int value = 0;
  const hipError_t r =
      call(api.hipDeviceGetAttribute, &value, static_cast<hipDeviceAttribute_t>(attribute_virtual_memory), device);
  *supported = r == hipSuccess && value != 0;
  return r;
}
constexpr std::string_view vm_granularity_call = "hipMemGetAllocationGranularity";
status vm_granularity(int device, std::size_t* granularity) {
  const allocation_prop_53 prop = pinned_to(device);
  return call(runtime().hipMemGetAllocationGranularity, granularity, &prop, hipMemAllocationGranularityMinimum);
}
constexpr std::string_view vm_reserve_call = "hipMemAddressReserve";
status vm_reserve(void** ptr, std::size_t bytes, std::size_t alignment) {
  return call(runtime().hipMemAddressReserve, ptr, bytes, alignment, static_cast<void*>(nullptr), 0ull);
}
constexpr std::string_view vm_free_call = "hipMemAddressFree";
status vm_free(void* ptr, std::size_t bytes) { return call(runtime().hipMemAddressFree, ptr, bytes); }
constexpr std::string_view vm_create_call = "hipMemCreate";
status vm_create(handle* physical, std::size_t bytes, int device) {
  const allocation_prop_53 prop = pinned_to(device);
  return call(runtime().hipMemCreate, reinterpret_cast<hipMemGenericAllocationHandle_t*>(physical), bytes, &prop, 0ull);
}
constexpr std::string_view vm_release_call = "hipMemRelease";
status vm_release(handle physical) {
  return call(runtime().hipMemRelease, static_cast<hipMemGenericAllocationHandle_t>(physical));
}
constexpr std::string_view vm_map_call = "hipMemMap";
status vm_map(void* ptr, std::size_t bytes, handle physical) {
  return call(runtime().hipMemMap, ptr, bytes, std::size_t{0}, static_cast<hipMemGenericAllocationHandle_t>(physical),
              0ull);
}
constexpr std::string_view vm_unmap_call = "hipMemUnmap";
status vm_unmap(void* ptr, std::size_t bytes) { return call(runtime().hipMemUnmap, ptr, bytes); }
constexpr std::string_view vm_set_access_call = "hipMemSetAccess";
status vm_set_access(void* ptr, std::size_t bytes, int device) {
  hipMemAccessDesc access{};
  access.location = {hipMemLocationTypeDevice, device};
  access.flags = hipMemAccessFlagsProtReadWrite;
  return call(runtime().hipMemSetAccess, ptr, bytes, &access, std::size_t{1});
}

const char* error_name(status code) { return runtime().hipGetErrorName(static_cast<hipError_t>(code)); }
const char* error_string(status code) { return runtime().hipGetErrorString(static_cast<hipError_t>(code)); }

}  // namespace

const gpu::runtime_api& table() {
  static const gpu::runtime_api instance = REFPOOL_GPU_TABLE("HIP", "hip", hipSuccess, hipErrorOutOfMemory);
  return instance;
}

}  // namespace refpool::detail::hip
