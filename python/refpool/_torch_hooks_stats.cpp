// What the hooks tell PyTorch about requests beyond serving them: each request counted into the
// device's statistics (_torch_hooks_counters.cpp: torch.cuda.memory_stats() keys allocation.*,
// allocated_bytes.*, requested_bytes.*, active.*, active_bytes.* and num_ooms;
// refpool/_torch_stats.py reads them and adds refpool's counters for reserved memory) and shown to
// PyTorch's profiler while it records memory (torch.profiler's profile_memory), as PyTorch's
// allocator reports them; refpool's reserved bytes are not known here and are reported as 0. Out of
// memory: the count, the profiler, the tracker, the observers and the start of PyTorch's message.
//
// Cost per request: the device's uncontended counter mutex (_torch_hooks_counters.hpp says why
// not atomics), one relaxed load and, while install() is in force, the profiler's thread-local
// check; beside the process-wide mutex and hash-map insert that PyTorch's pluggable allocator
// itself takes per request.
//
// PyTorch functions used (c10/core/Allocator.h, the same from PyTorch 2.6 to 2.15):
// memoryProfilingEnabled(), reportMemoryUsageToProfiler(void*, int64_t, size_t, size_t, Device),
// reportOutOfMemoryToProfiler(int64_t, size_t, size_t, Device). docs/frameworks.md lists every
// PyTorch declaration the hooks rely on.
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "_torch_hooks.hpp"
#include "_torch_hooks_counters.hpp"

namespace {

using oom_observer = void (*)(std::int64_t device, std::size_t size, std::size_t total, std::size_t free);
std::atomic<oom_observer> observer{nullptr};
// Whether the hooks serve PyTorch's requests (install()), rather than segments to PyTorch's own
// allocator (mem_pool()), which reports its tensors to the profiler itself.
std::atomic<bool> installed{false};

c10::Device cuda_device(int device) { return {c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)}; }

bool profiling() { return installed.load(std::memory_order_relaxed) && c10::memoryProfilingEnabled(); }

// Sizes as PyTorch's messages print them ("800000000.00 GiB").
std::string format_size(std::size_t size) {
  char text[64];
  const auto bytes = static_cast<double>(size);
  if (size <= 1024)
    std::snprintf(text, sizeof text, "%zu bytes", size);
  else if (size <= (std::size_t{1} << 20))
    std::snprintf(text, sizeof text, "%.2f KiB", bytes / 1024.0);
  else if (size <= (std::size_t{1} << 30))
    std::snprintf(text, sizeof text, "%.2f MiB", bytes / 1048576.0);
  else
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / 1073741824.0);
  return text;
}

}  // namespace

namespace refpool_torch {

void count_alloc(void* ptr, int device, std::size_t size) {
  device_counters* c = counters_of(device);
  if (c == nullptr) return;
  const std::int64_t allocated = c->on_alloc(size);
  if (profiling())
    c10::reportMemoryUsageToProfiler(ptr, static_cast<std::int64_t>(size), static_cast<std::size_t>(allocated), 0,
                                     cuda_device(device));
}

void count_free(void* ptr, int device, std::size_t size, bool still_active) {
  device_counters* c = counters_of(device);
  if (c == nullptr) return;
  const std::int64_t allocated = c->on_free(size, still_active);
  if (profiling())
    c10::reportMemoryUsageToProfiler(ptr, -static_cast<std::int64_t>(size), static_cast<std::size_t>(allocated), 0,
                                     cuda_device(device));
}

// Not shown to the profiler: PyTorch reports a block at its free, deferred or not.
void count_inactive(int device, std::size_t size) {
  if (device_counters* c = counters_of(device)) c->on_inactive(size);
}

std::string out_of_memory(int device, std::size_t size) {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  try {  // relaxed: the request may come from a stream capturing in global mode
    c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
  } catch (const std::exception&) {  // the out-of-memory error that follows matters more
  }
  device_counters* c = counters_of(device);
  const std::int64_t allocated = c != nullptr ? c->on_oom() : 0;
  if (profiling())
    c10::reportOutOfMemoryToProfiler(static_cast<std::int64_t>(size), static_cast<std::size_t>(allocated), 0,
                                     cuda_device(device));
  if (const tracker* t = current_tracker()) t->oom(size, device, free_bytes);
  // As PyTorch's allocator: the device's cap when a memory fraction is set, else its total.
  const double fraction = memory_fraction(device);
  const bool capped = fraction < 1.0;
  const auto cap = capped ? static_cast<std::size_t>(fraction * static_cast<double>(total_bytes)) : total_bytes;
  if (const oom_observer notify = observer.load(std::memory_order_acquire)) notify(device, size, cap, free_bytes);
  std::string message = "CUDA out of memory. Tried to allocate " + format_size(size) + ". GPU " +
                        std::to_string(device) + " has a total capacity of " + format_size(total_bytes) + " of which " +
                        format_size(free_bytes) + " is free. ";
  if (capped)
    message += "This process is limited to " + format_size(cap) + " by set_per_process_memory_fraction(" +
               std::to_string(fraction) + "). ";
  return message;
}

}  // namespace refpool_torch

extern "C" {

/// install() made these hooks PyTorch's allocator (from then on requests are reported to the profiler).
void refpool_torch_hooks_set_installed() { installed.store(true, std::memory_order_relaxed); }

/// Sets the function called before torch.OutOfMemoryError is raised (NULL: none), with PyTorch's
/// observer arguments: device, bytes requested, the device's cap, its free bytes.
void refpool_torch_hooks_set_oom_observer(oom_observer notify) { observer.store(notify, std::memory_order_release); }

}  // extern "C"
