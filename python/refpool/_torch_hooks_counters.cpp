// The hooks' per-device statistics (device_counters, _torch_hooks_counters.hpp), memory fractions
// and the requests served uncounted while caching is off, and the C functions
// refpool/_torch_stats.py reads them with. Torch-free, so the host test builds this file on its
// own; _torch_hooks_stats.cpp counts into it and reports to PyTorch.
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_set>

#include "_torch_hooks.hpp"
#include "_torch_hooks_counters.hpp"

namespace {

constexpr int max_devices = 64;  // as refpool's framework allocator

struct device_state {
  refpool_torch::device_counters counters;
  std::atomic<double> fraction{1.0};
};

// Leaked: PyTorch frees tensors from static destructors, after this library's own would have run.
device_state* state_of(int device) {
  static auto* devices = new device_state[max_devices];
  return device >= 0 && device < max_devices ? &devices[device] : nullptr;
}

// The requests served while caching was off, until their frees.
struct uncounted_requests {
  std::atomic<std::size_t> count{0};  // lets frees skip the lock while none is remembered
  std::mutex mutex;
  std::unordered_set<void*> pointers;
};

uncounted_requests& uncounted() {
  static auto* requests = new uncounted_requests;  // leaked, as the devices' state
  return *requests;
}

}  // namespace

namespace refpool_torch {

void note_uncounted(void* ptr) {
  uncounted_requests& u = uncounted();
  std::lock_guard guard(u.mutex);
  if (u.pointers.insert(ptr).second) u.count.fetch_add(1, std::memory_order_release);
}

bool forget_uncounted(void* ptr) {
  uncounted_requests& u = uncounted();
  if (u.count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard guard(u.mutex);
  if (u.pointers.erase(ptr) == 0) return false;
  u.count.fetch_sub(1, std::memory_order_release);
  return true;
}

device_counters* counters_of(int device) {
  device_state* d = state_of(device);
  return d != nullptr ? &d->counters : nullptr;
}

void remember_memory_fraction(int device, double fraction) {
  if (device_state* d = state_of(device)) d->fraction.store(fraction, std::memory_order_relaxed);
}

double memory_fraction(int device) {
  const device_state* d = state_of(device);
  return d != nullptr ? d->fraction.load(std::memory_order_relaxed) : 1.0;
}

}  // namespace refpool_torch

extern "C" {

/// The number of values refpool_torch_hooks_device_stats writes (Python checks its layout with it).
int refpool_torch_hooks_stat_count() { return refpool_torch::device_counters::values; }

/// Writes the device's counters ([kind][class][current, peak, allocated, freed], then num_ooms)
/// into out[0..capacity). Returns the number written, or -1 for a device out of range.
int refpool_torch_hooks_device_stats(int device, std::int64_t* out, int capacity) {
  refpool_torch::device_counters* c = refpool_torch::counters_of(device);
  if (c == nullptr || out == nullptr) return -1;
  return c->read(out, capacity);
}

/// torch.cuda.reset_peak_memory_stats(device): each peak restarts from the current value.
void refpool_torch_hooks_reset_peak_stats(int device) {
  if (refpool_torch::device_counters* c = refpool_torch::counters_of(device)) c->reset_peaks();
}

/// torch.cuda.reset_accumulated_memory_stats(device): the totals allocated and freed, and num_ooms.
void refpool_torch_hooks_reset_accumulated_stats(int device) {
  if (refpool_torch::device_counters* c = refpool_torch::counters_of(device)) c->reset_accumulated();
}

/// The fraction last given to torch.cuda.set_per_process_memory_fraction for the device (1.0 before).
double refpool_torch_hooks_memory_fraction(int device) { return refpool_torch::memory_fraction(device); }

}  // extern "C"
