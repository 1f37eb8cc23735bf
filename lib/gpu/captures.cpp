#include "gpu/captures.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <new>
#include <vector>

namespace refpool::detail::gpu {

namespace {
struct device_captures {
  std::mutex mutex;  // held by a device_wait: a capture is not announced during the wait
  int count = 0;
  std::vector<kept_for_capture*> kept;
};
std::array<device_captures, std::size_t{counted_devices}>& devices() {
  static auto* instance =
      new std::array<device_captures, std::size_t{counted_devices}>;  // leaked: frees may come from static destructors
  return *instance;
}

device_captures* counted(int device) noexcept {
  return device >= 0 && device < counted_devices ? &devices()[static_cast<std::size_t>(device)]
             : nullptr;
}
}  // namespace

void capture_announced(int device) noexcept {
  if (device_captures* d = counted(device)) {
    std::lock_guard lock(d->mutex);
    d->count += 1;
  }
}

bool capture_over(int device) noexcept {
  device_captures* d = counted(device);
  if (d == nullptr) return false;
  std::vector<kept_for_capture*> due;
  {
    // Lowered under the lock device_wait registers under: memory kept for a capture is never
    // registered after the last capture_over has looked.
    std::lock_guard lock(d->mutex);
    if (d->count == 0) return false;  // never below 0
    if (--d->count != 0) return true;
    due.swap(d->kept);
  }
  for (kept_for_capture* k : due) k->settle();
  return true;
}

device_wait permit_device_wait(int device, kept_for_capture* kept) noexcept {
  device_wait wait;
  device_captures* d = counted(device);
  if (d == nullptr) return wait;
  wait.captures_held_off_ = std::unique_lock(d->mutex);
  if (d->count == 0) return wait;
  wait.allowed_ = false;
  if (kept != nullptr && std::find(d->kept.begin(), d->kept.end(), kept) == d->kept.end()) {
    try {
      d->kept.push_back(kept);
    } catch (const std::bad_alloc&) {}  // kept until a later free_pieces waits for the device
  }
  wait.captures_held_off_.unlock();
  return wait;
}

}  // namespace refpool::detail::gpu
