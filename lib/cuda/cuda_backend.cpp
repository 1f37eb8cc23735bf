// refpool::cuda: process-wide backends per (device, memory kind), streams, modules, launches
// and copies over the loaded driver.
#include <refpool/cuda.hpp>
#include <refpool/error.hpp>

#include <fmt/format.h>

#include "../gpu/runtime_api.hpp"
#include "cuda_runtime_api_table.hpp"
#include "driver.hpp"

namespace refpool::cuda {

namespace {

using detail::cuda::check;
using detail::cuda::driver;

detail::gpu::device_guard on_device(int ordinal) { return {detail::cuda::runtime_table(), ordinal}; }

CUdeviceptr as_device_ptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// Stream-ordered allocations come from the device's default pool; keep what it frees, as
// refpool's own cache does, instead of returning it to the OS at every synchronisation.
void keep_default_pool_memory(int ordinal) {
  CUdevice device = 0;
  CUmemoryPool pool = nullptr;
  check(driver().cuDeviceGet(&device, ordinal), "cuDeviceGet");
  check(driver().cuDeviceGetDefaultMemPool(&pool, device), "cuDeviceGetDefaultMemPool");
  cuuint64_t threshold = ~cuuint64_t{0};
  check(driver().cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), "cuMemPoolSetAttribute");
}

// Synchronises and destroys a stream refpool made, retiring its handle first (see retire_stream).
void destroy_stream(void* handle) noexcept {
  if (handle == nullptr) return;
  driver().cuStreamSynchronize(static_cast<CUstream>(handle));
  detail::gpu::retire_stream(handle);
  driver().cuStreamDestroy(static_cast<CUstream>(handle));
}

}  // namespace

bool available() noexcept { return detail::cuda::unavailable_reason().empty(); }

std::string unavailable_reason() { return detail::cuda::unavailable_reason(); }

int device_count() { return driver().device_count; }

int driver_version() { return driver().version; }

std::string device_name(int ordinal) {
  detail::cuda::context(ordinal);  // validates the ordinal
  CUdevice device = 0;
  check(driver().cuDeviceGet(&device, ordinal), "cuDeviceGet");
  char name[256] = {};
  check(driver().cuDeviceGetName(name, sizeof name, device), "cuDeviceGetName");
  return name;
}

std::pair<std::size_t, std::size_t> memory_info(int ordinal) {
  auto guard = on_device(ordinal);
  std::size_t free = 0;
  std::size_t total = 0;
  check(driver().cuMemGetInfo(&free, &total), "cuMemGetInfo", fmt::format("device {}", ordinal));
  return {free, total};
}

backend device(int ordinal, memory_kind kind) {
  if (kind != memory_kind::host) detail::cuda::context(ordinal);  // throws for missing driver or device
  return detail::gpu::shared_backend(detail::cuda::runtime_table(), "cuda", ordinal, kind, keep_default_pool_memory);
}

stream::stream(int ordinal) : device_(ordinal) {
  auto guard = on_device(ordinal);
  CUstream s = nullptr;
  check(driver().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate", fmt::format("device {}", ordinal));
  detail::gpu::revive_stream(s);
  handle_ = s;
}

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

void stream::synchronize() const { cuda::synchronize(ref(), device_); }

void synchronize(stream_ref s, int ordinal) {
  auto guard = on_device(ordinal);
  check(driver().cuStreamSynchronize(static_cast<CUstream>(s.handle)), "cuStreamSynchronize");
}

module::module(int ordinal, std::string_view image) : device_(ordinal) {
  auto guard = on_device(ordinal);
  const std::string text(image);  // PTX must end in a NUL
  char log[4096] = {};
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log, reinterpret_cast<void*>(sizeof log)};
  CUmodule m = nullptr;
  check(driver().cuModuleLoadDataEx(&m, text.c_str(), 2, options, values), "cuModuleLoadDataEx",
        fmt::format("device {}; JIT log: {}", ordinal, log));
  handle_ = m;
}

module::~module() {
  if (handle_ != nullptr) driver().cuModuleUnload(static_cast<CUmodule>(handle_));
}

kernel module::function(const char* name) const {
  CUfunction f = nullptr;
  check(driver().cuModuleGetFunction(&f, static_cast<CUmodule>(handle_), name), "cuModuleGetFunction", name);
  return {f, device_};
}

void launch(const kernel& k, dims3 grid, dims3 block, stream_ref s, void** args, unsigned shared_bytes) {
  auto guard = on_device(k.device);
  check(driver().cuLaunchKernel(static_cast<CUfunction>(k.function), grid.x, grid.y, grid.z, block.x, block.y,
                                block.z, shared_bytes, static_cast<CUstream>(s.handle), args, nullptr),
        "cuLaunchKernel",
        fmt::format("grid ({}, {}, {}), block ({}, {}, {})", grid.x, grid.y, grid.z, block.x, block.y, block.z));
}

void copy(void* dst, const void* src, std::size_t bytes, stream_ref s, int ordinal) {
  auto guard = on_device(ordinal);
  check(driver().cuMemcpyAsync(as_device_ptr(dst), as_device_ptr(src), bytes, static_cast<CUstream>(s.handle)),
        "cuMemcpyAsync", fmt::format("{} B from {} to {}", bytes, src, dst));
}

void fill(void* dst, unsigned char value, std::size_t bytes, stream_ref s, int ordinal) {
  auto guard = on_device(ordinal);
  check(driver().cuMemsetD8Async(as_device_ptr(dst), value, bytes, static_cast<CUstream>(s.handle)),
        "cuMemsetD8Async", fmt::format("{} B at {}", bytes, dst));
}

void copy_peer(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes, stream_ref s) {
  auto guard = on_device(dst_device);
  check(driver().cuMemcpyPeerAsync(as_device_ptr(dst), detail::cuda::context(dst_device), as_device_ptr(src),
                                   detail::cuda::context(src_device), bytes, static_cast<CUstream>(s.handle)),
        "cuMemcpyPeerAsync", fmt::format("{} B from device {} to device {}", bytes, src_device, dst_device));
}

}  // namespace refpool::cuda
