// refpool::hip: process-wide backends per (device, memory kind), streams, modules, launches and
// copies over the loaded HIP runtime. Memory, stream ordering and errors are the shared GPU
// layer's (lib/gpu/); this file only maps the public calls onto HIP entry points.
#include <refpool/error.hpp>
#include <refpool/hip.hpp>

#include <cstdint>

#include <fmt/format.h>

#include "code_object.hpp"
#include "runtime.hpp"

namespace refpool::hip {

namespace {

using detail::hip::call;
using detail::hip::check;
using detail::hip::runtime;

detail::gpu::device_guard on_device(int ordinal) { return {detail::hip::runtime_table(), ordinal}; }

hipStream_t as_stream(stream_ref s) { return static_cast<hipStream_t>(s.handle); }

// Stream-ordered allocations come from the device's default pool; keep what it frees, as
// refpool's own cache does, instead of returning it to the system at every synchronisation.
void keep_default_pool_memory(int ordinal) {
  hipMemPool_t pool = nullptr;
  check(call(runtime().hipDeviceGetDefaultMemPool, &pool, ordinal), "hipDeviceGetDefaultMemPool");
  std::uint64_t threshold = ~std::uint64_t{0};
  check(call(runtime().hipMemPoolSetAttribute, pool, hipMemPoolAttrReleaseThreshold, &threshold), "hipMemPoolSetAttribute");
}

}  // namespace

bool available() noexcept { return detail::hip::unavailable_reason().empty(); }

std::string unavailable_reason() { return detail::hip::unavailable_reason(); }

int device_count() { return runtime().device_count; }

int runtime_version() { return runtime().version; }

int driver_version() {
  int version = 0;
  check(call(runtime().hipDriverGetVersion, &version), "hipDriverGetVersion");
  return version;
}

std::string device_name(int ordinal) {
  detail::hip::check_device(ordinal);
  hipDevice_t device = 0;
  check(call(runtime().hipDeviceGet, &device, ordinal), "hipDeviceGet");
  char name[256] = {};
  check(call(runtime().hipDeviceGetName, name, sizeof name, device), "hipDeviceGetName");
  return name;
}

std::pair<std::size_t, std::size_t> memory_info(int ordinal) {
  auto guard = on_device(ordinal);
  std::size_t free = 0;
  std::size_t total = 0;
  check(call(runtime().hipMemGetInfo, &free, &total), "hipMemGetInfo", fmt::format("device {}", ordinal));
  return {free, total};
}

backend device(int ordinal, memory_kind kind) {
  if (kind != memory_kind::host) detail::hip::check_device(ordinal);  // throws for missing runtime or device
  if (kind == memory_kind::device_async && runtime().version < detail::hip::minimum_async_version)
    throw backend_unavailable(fmt::format(
        "refpool: HIP stream-ordered memory (memory_kind::device_async) needs HIP {} or newer: the HIP {} of {} "
        "crashes in hipMallocAsync on the default stream; use memory_kind::device",
        detail::hip::version_text(detail::hip::minimum_async_version), detail::hip::version_text(runtime().version),
        runtime().library));
  return detail::gpu::shared_backend(detail::hip::runtime_table(), "hip", ordinal, kind, keep_default_pool_memory);
}

stream::stream(int ordinal) : device_(ordinal) {
  auto guard = on_device(ordinal);
  hipStream_t s = nullptr;
  check(call(runtime().hipStreamCreateWithFlags, &s, hipStreamNonBlocking), "hipStreamCreateWithFlags",
        fmt::format("device {}", ordinal));
  detail::gpu::revive_stream(s);
  handle_ = s;
}

namespace {
// Synchronises and destroys a stream refpool made, retiring its handle first (see retire_stream).
void destroy_stream(void* handle) noexcept {
  if (handle == nullptr) return;
  (void)call(runtime().hipStreamSynchronize, static_cast<hipStream_t>(handle));
  detail::gpu::retire_stream(handle);
  (void)call(runtime().hipStreamDestroy, static_cast<hipStream_t>(handle));
}
}  // namespace

stream::~stream() { destroy_stream(handle_); }

void retire_stream(stream_ref s, int ordinal) {
  synchronize(s, ordinal);
  detail::gpu::retire_stream(s.handle);
}

stream& stream::operator=(stream&& other) noexcept {
  if (this != &other) {
    destroy_stream(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void stream::synchronize() const { hip::synchronize(ref(), device_); }

void synchronize(stream_ref s, int ordinal) {
  auto guard = on_device(ordinal);
  check(call(runtime().hipStreamSynchronize, as_stream(s)), "hipStreamSynchronize");
}

module::module(int ordinal, std::string_view image) : device_(ordinal) {
  auto guard = on_device(ordinal);
  if (runtime().version < detail::hip::minimum_checked_load_version) detail::hip::check_code_object(ordinal, image);
  hipModule_t m = nullptr;
  check(call(runtime().hipModuleLoadData, &m, image.data()), "hipModuleLoadData",
        fmt::format("device {}, {} B image", ordinal, image.size()));
  handle_ = m;
}

// Module calls run with the module's device current: hipModuleGetFunction aborts the process
// (ROCm 5.2 to 6.3) when another device is current.
module::~module() {
  if (handle_ == nullptr) return;
  try {
    auto guard = on_device(device_);
    (void)call(runtime().hipModuleUnload, static_cast<hipModule_t>(handle_));
  } catch (const std::exception&) {  // the device cannot be made current: the module goes with the process
  }
}

kernel module::function(const char* name) const {
  auto guard = on_device(device_);
  hipFunction_t f = nullptr;
  check(call(runtime().hipModuleGetFunction, &f, static_cast<hipModule_t>(handle_), name), "hipModuleGetFunction", name);
  return {f, device_};
}

void launch(const kernel& k, dims3 grid, dims3 block, stream_ref s, void** args, unsigned shared_bytes) {
  auto guard = on_device(k.device);
  check(call(runtime().hipModuleLaunchKernel, static_cast<hipFunction_t>(k.function), grid.x, grid.y, grid.z, block.x,
                                        block.y, block.z, shared_bytes, as_stream(s), args, nullptr),
        "hipModuleLaunchKernel",
        fmt::format("grid ({}, {}, {}), block ({}, {}, {})", grid.x, grid.y, grid.z, block.x, block.y, block.z));
}

void copy(void* dst, const void* src, std::size_t bytes, stream_ref s, int ordinal) {
  auto guard = on_device(ordinal);
  check(call(runtime().hipMemcpyAsync, dst, src, bytes, hipMemcpyDefault, as_stream(s)), "hipMemcpyAsync",
        fmt::format("{} B from {} to {}", bytes, src, dst));
}

void fill(void* dst, unsigned char value, std::size_t bytes, stream_ref s, int ordinal) {
  auto guard = on_device(ordinal);
  check(call(runtime().hipMemsetAsync, dst, value, bytes, as_stream(s)), "hipMemsetAsync",
        fmt::format("{} B at {}", bytes, dst));
}

void copy_peer(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes, stream_ref s) {
  detail::hip::check_device(src_device);
  auto guard = on_device(dst_device);
  check(call(runtime().hipMemcpyPeerAsync, dst, dst_device, src, src_device, bytes, as_stream(s)), "hipMemcpyPeerAsync",
        fmt::format("{} B from device {} to device {}", bytes, src_device, dst_device));
}

}  // namespace refpool::hip
