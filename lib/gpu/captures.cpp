#include "gpu/captures.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <new>
#include <vector>

namespace refpool::detail::gpu {

namespace {
// Devices 0 to 63, as the framework allocator's; others are never announced.
constexpr std::size_t counted_devices = 64;

struct announced_captures {
  std::array<std::atomic<int>, counted_devices> counts{};  // lowered under `mutex`
  std::mutex mutex;
  std::array<std::vector<kept_for_capture*>, counted_devices> kept;  // under `mutex`
};
announced_captures& state() {
  static auto* instance = new announced_captures;  // leaked: frees may come from static destructors
  return *instance;
}

bool counted(int device) noexcept { return device >= 0 && static_cast<std::size_t>(device) < counted_devices; }
}  // namespace

void capture_announced(int device) noexcept {
  if (counted(device)) state().counts[static_cast<std::size_t>(device)].fetch_add(1, std::memory_order_acq_rel);
}

void capture_over(int device) noexcept {
  if (!counted(device)) return;
  announced_captures& s = state();
  const auto at = static_cast<std::size_t>(device);
  std::vector<kept_for_capture*> due;
  {
    // Lowered under the lock settle_later checks under: memory kept for a capture is never
    // registered after the last capture_over has looked.
    std::lock_guard lock(s.mutex);
    if (s.counts[at].fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    due.swap(s.kept[at]);
  }
  for (kept_for_capture* k : due) k->settle();
}

bool capture_may_run(int device) noexcept {
  return counted(device) && state().counts[static_cast<std::size_t>(device)].load(std::memory_order_acquire) > 0;
}

bool settle_later(int device, kept_for_capture& kept) noexcept {
  if (!counted(device)) return false;
  announced_captures& s = state();
  const auto at = static_cast<std::size_t>(device);
  std::lock_guard lock(s.mutex);
  if (s.counts[at].load(std::memory_order_acquire) == 0) return false;
  auto& list = s.kept[at];
  if (std::find(list.begin(), list.end(), &kept) == list.end()) {
    try {
      list.push_back(&kept);
    } catch (const std::bad_alloc&) {}  // kept until a later give_back waits for the device
  }
  return true;
}

}  // namespace refpool::detail::gpu
