// PyTorch's per-device memory statistics, counted by refpool's PyTorch hooks as requests come and
// go: torch.cuda.memory_stats() keys allocation.*, allocated_bytes.*, active*, requested_bytes.*
// (current, peak, allocated, freed; all, small_pool, large_pool) and num_ooms. refpool's cache
// counters span devices and size classes, and PyTorch's pluggable interface forwards no stats call,
// so refpool/_torch_stats.py reads these and adds refpool's counters for reserved memory.
//
// Requests are also reported to PyTorch's profiler while it records memory (torch.profiler's
// profile_memory), as PyTorch's allocator reports them; refpool's reserved bytes are not known here
// and are reported as 0.
//
// Cost: one uncontended mutex per request and device, and the profiler's thread-local check, beside
// the process-wide mutex and hash-map insert PyTorch's pluggable allocator itself takes per request.
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "_torch_hooks.hpp"

namespace {

constexpr int max_devices = 64;                           // as refpool's framework allocator
constexpr std::size_t small_size = std::size_t{1} << 20;  // PyTorch's kSmallSize: its small pool
constexpr std::size_t block_granule = 512;                // PyTorch's kMinBlockSize, refpool's piece unit

struct stat {
  std::int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void increase(std::int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t n) {
    current -= n;
    freed += n;
  }
};

// The layout Python reads (refpool/_torch_stats.py, HOOK_STATS): [kind][class][field], then num_ooms.
enum kind { allocation, allocated_bytes, requested_bytes, kinds };
enum size_class { all_classes, small_pool, large_pool, classes };
constexpr int fields = 4;
constexpr int stat_values = kinds * classes * fields + 1;

struct device_stats {
  std::mutex mutex;
  std::array<std::array<stat, classes>, kinds> stats{};
  std::int64_t ooms = 0;
  double fraction = 1.0;

  // Applies `change` to the request's counters; returns the device's allocated bytes after it.
  template <class F>
  std::int64_t update(std::size_t size, F&& change) {
    const size_class c = size <= small_size ? small_pool : large_pool;
    const auto block = static_cast<std::int64_t>((size + block_granule - 1) / block_granule * block_granule);
    const auto requested = static_cast<std::int64_t>(size);
    std::lock_guard lock(mutex);
    for (const size_class k : {all_classes, c}) {
      change(stats[allocation][k], std::int64_t{1});
      change(stats[allocated_bytes][k], block);
      change(stats[requested_bytes][k], requested);
    }
    return stats[allocated_bytes][all_classes].current;
  }
};

// Leaked: PyTorch frees tensors from static destructors, after this library's own would have run.
device_stats* stats_of(int device) {
  static auto* devices = new std::array<device_stats, max_devices>;
  return device >= 0 && device < max_devices ? &(*devices)[static_cast<std::size_t>(device)] : nullptr;
}

using oom_observer = void (*)(std::int64_t device, std::size_t size, std::size_t total, std::size_t free);
std::atomic<oom_observer> observer{nullptr};
// Whether the hooks serve PyTorch's requests (install()), rather than segments to PyTorch's own
// allocator (mem_pool()), which reports its tensors to the profiler itself.
std::atomic<bool> installed{false};

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
  device_stats* d = stats_of(device);
  if (d == nullptr) return;
  const std::int64_t allocated = d->update(size, [](stat& s, std::int64_t n) { s.increase(n); });
  if (installed.load(std::memory_order_relaxed) && c10::memoryProfilingEnabled())
    c10::reportMemoryUsageToProfiler(ptr, static_cast<std::int64_t>(size), static_cast<std::size_t>(allocated), 0,
                                     c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
}

void count_free(void* ptr, int device, std::size_t size) {
  device_stats* d = stats_of(device);
  if (d == nullptr) return;
  const std::int64_t allocated = d->update(size, [](stat& s, std::int64_t n) { s.decrease(n); });
  if (installed.load(std::memory_order_relaxed) && c10::memoryProfilingEnabled())
    c10::reportMemoryUsageToProfiler(ptr, -static_cast<std::int64_t>(size), static_cast<std::size_t>(allocated), 0,
                                     c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
}

void remember_memory_fraction(int device, double fraction) {
  if (device_stats* d = stats_of(device)) {
    std::lock_guard lock(d->mutex);
    d->fraction = fraction;
  }
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
  double fraction = 1.0;
  if (device_stats* d = stats_of(device)) {
    std::lock_guard lock(d->mutex);
    ++d->ooms;
    fraction = d->fraction;
  }
  if (const tracker* t = current_tracker()) t->oom(size, device, free_bytes);
  // As PyTorch's allocator: the device's cap when a memory fraction is set, else its total.
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

/// The number of values refpool_torch_hooks_device_stats writes (Python checks its layout with it).
int refpool_torch_hooks_stat_count() { return stat_values; }

/// Writes the device's counters ([kind][class][current, peak, allocated, freed], then num_ooms)
/// into out[0..capacity). Returns the number written, or -1 for a device out of range.
int refpool_torch_hooks_device_stats(int device, std::int64_t* out, int capacity) {
  device_stats* d = stats_of(device);
  if (d == nullptr || out == nullptr) return -1;
  std::lock_guard lock(d->mutex);
  int n = 0;
  for (const auto& by_class : d->stats)
    for (const stat& s : by_class)
      for (const std::int64_t v : {s.current, s.peak, s.allocated, s.freed})
        if (n < capacity) out[n++] = v;
  if (n < capacity) out[n++] = d->ooms;
  return n;
}

/// torch.cuda.reset_peak_memory_stats(device): each peak restarts from the current value.
void refpool_torch_hooks_reset_peak_stats(int device) {
  if (device_stats* d = stats_of(device)) {
    std::lock_guard lock(d->mutex);
    for (auto& by_class : d->stats)
      for (stat& s : by_class) s.peak = s.current;
  }
}

/// torch.cuda.reset_accumulated_memory_stats(device): the totals allocated and freed, and num_ooms.
void refpool_torch_hooks_reset_accumulated_stats(int device) {
  if (device_stats* d = stats_of(device)) {
    std::lock_guard lock(d->mutex);
    for (auto& by_class : d->stats)
      for (stat& s : by_class) s.allocated = s.freed = 0;
    d->ooms = 0;
  }
}

/// The fraction last given to torch.cuda.set_per_process_memory_fraction for the device (1.0 before).
double refpool_torch_hooks_memory_fraction(int device) {
  device_stats* d = stats_of(device);
  if (d == nullptr) return 1.0;
  std::lock_guard lock(d->mutex);
  return d->fraction;
}

/// install() made these hooks PyTorch's allocator (from then on requests are reported to the profiler).
void refpool_torch_hooks_set_installed() { installed.store(true, std::memory_order_relaxed); }

/// Sets the function called before torch.OutOfMemoryError is raised (NULL: none), with PyTorch's
/// observer arguments: device, bytes requested, the device's cap, its free bytes.
void refpool_torch_hooks_set_oom_observer(oom_observer notify) { observer.store(notify, std::memory_order_release); }

}  // extern "C"
