// refpool::hip: process-wide backends per (device, memory kind), streams, modules, launches and
// copies over the loaded HIP runtime. Memory, stream ordering and errors are the shared GPU
// layer's (lib/gpu/); this file only maps the public calls onto HIP entry points.
#include <refpool/error.hpp>
#include <refpool/hip.hpp>

#include <cstdint>

#include <fmt/format.h>

#include "runtime.hpp"

namespace refpool::hip {

namespace {

using detail::hip::check;
using detail::hip::runtime;

detail::gpu::device_guard on_device(int ordinal) { return {detail::hip::runtime_table(), ordinal}; }

hipStream_t as_stream(stream_ref s) { return static_cast<hipStream_t>(s.handle); }

// Stream-ordered allocations come from the device's default pool; keep what it frees, as
// refpool's own cache does, instead of returning it to the system at every synchronisation.
void keep_default_pool_memory(int ordinal) {
  hipMemPool_t pool = nullptr;
  check(runtime().hipDeviceGetDefaultMemPool(&pool, ordinal), "hipDeviceGetDefaultMemPool");
  std::uint64_t threshold = ~std::uint64_t{0};
  check(runtime().hipMemPoolSetAttribute(pool, hipMemPoolAttrReleaseThreshold, &threshold), "hipMemPoolSetAttribute");
}

}  // namespace

bool available() noexcept { return detail::hip::unavailable_reason().empty(); }

std::string unavailable_reason() { return detail::hip::unavailable_reason(); }

int device_count() { return runtime().device_count; }

int runtime_version() { return runtime().version; }

int driver_version() {
  int version = 0;
  check(runtime().hipDriverGetVersion(&version), "hipDriverGetVersion");
  return version;
}

std::string device_name(int ordinal) {
  detail::hip::check_device(ordinal);
  hipDevice_t device = 0;
  check(runtime().hipDeviceGet(&device, ordinal), "hipDeviceGet");
  char name[256] = {};
  check(runtime().hipDeviceGetName(name, sizeof name, device), "hipDeviceGetName");
  return name;
}

std::pair<std::size_t, std::size_t> memory_info(int ordinal) {
  auto guard = on_device(ordinal);
  std::size_t free = 0;
  std::size_t total = 0;
  check(runtime().hipMemGetInfo(&free, &total), "hipMemGetInfo", fmt::format("device {}", ordinal));
  return {free, total};
}

backend device(int ordinal, memory_kind kind) {
  if (kind != memory_kind::host) detail::hip::check_device(ordinal);  // throws for missing runtime or device
  return detail::gpu::shared_backend(detail::hip::runtime_table(), "hip", ordinal, kind, keep_default_pool_memory);
}

stream::stream(int ordinal) : device_(ordinal) {
  auto guard = on_device(ordinal);
  hipStream_t s = nullptr;
  check(runtime().hipStreamCreateWithFlags(&s, hipStreamNonBlocking), "hipStreamCreateWithFlags",
        fmt::format("device {}", ordinal));
  detail::gpu::revive_stream(s);
  handle_ = s;
}

namespace {
// Synchronises and destroys a stream refpool made, retiring its handle first (see retire_stream).
void destroy_stream(void* handle) noexcept {
  if (handle == nullptr) return;
  (void)runtime().hipStreamSynchronize(static_cast<hipStream_t>(handle));
  detail::gpu::retire_stream(handle);
  (void)runtime().hipStreamDestroy(static_cast<hipStream_t>(handle));
}
}  // namespace

stream::~stream() { destroy_stream(handle_); }

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
  check(runtime().hipStreamSynchronize(as_stream(s)), "hipStreamSynchronize");
}

void retire_stream(stream_ref s, int ordinal) {
  synchronize(s, ordinal);
  detail::gpu::retire_stream(s.handle);
}

module::module(int ordinal, std::string_view image) : device_(ordinal) {
  auto guard = on_device(ordinal);
  hipModule_t m = nullptr;
  check(runtime().hipModuleLoadData(&m, image.data()), "hipModuleLoadData",
        fmt::format("device {}, {} B image", ordinal, image.size()));
  handle_ = m;
}

module::~module() {
  if (handle_ != nullptr) (void)runtime().hipModuleUnload(static_cast<hipModule_t>(handle_));
}

kernel module::function(const char* name) const {
  hipFunction_t f = nullptr;
  check(runtime().hipModuleGetFunction(&f, static_cast<hipModule_t>(handle_), name), "hipModuleGetFunction", name);
  return {f, device_};
}

void launch(const kernel& k, dims3 grid, dims3 block, stream_ref s, void** args, unsigned shared_bytes) {
  auto guard = on_device(k.device);
  check(runtime().hipModuleLaunchKernel(static_cast<hipFunction_t>(k.function), grid.x, grid.y, grid.z, block.x,
                                        block.y, block.z, shared_bytes, as_stream(s), args, nullptr),
        "hipModuleLaunchKernel",
        fmt::format("grid ({}, {}, {}), block ({}, {}, {})", grid.x, grid.y, grid.z, block.x, block.y, block.z));
}

void copy(void* dst, const void* src, std::size_t bytes, stream_ref s, int ordinal) {
  auto guard = on_device(ordinal);
  check(runtime().hipMemcpyAsync(dst, src, bytes, hipMemcpyDefault, as_stream(s)), "hipMemcpyAsync",
        fmt::format("{} B from {} to {}", bytes, src, dst));
}

void fill(void* dst, unsigned char value, std::size_t bytes, stream_ref s, int ordinal) {
  auto guard = on_device(ordinal);
  check(runtime().hipMemsetAsync(dst, value, bytes, as_stream(s)), "hipMemsetAsync",
        fmt::format("{} B at {}", bytes, dst));
}

void copy_peer(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes, stream_ref s) {
  detail::hip::check_device(src_device);
  auto guard = on_device(dst_device);
  check(runtime().hipMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, as_stream(s)), "hipMemcpyPeerAsync",
        fmt::format("{} B from device {} to device {}", bytes, src_device, dst_device));
}

}  // namespace refpool::hip
