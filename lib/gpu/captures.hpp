// Graph captures that a framework announced: while one may run on a device, refpool never waits
// for the whole device. A device-wide wait (cuCtxSynchronize, hipDeviceSynchronize) while any
// stream of the device captures fails and invalidates that capture, whatever the thread's capture
// mode, and no driver call says whether some stream of a device captures. The framework allocator
// announces each route to a private pool (PyTorch's beginAllocateToPool .. endAllocateToPool, which
// brackets every CUDA graph capture, and use_mem_pool).
#pragma once

#include <mutex>

namespace refpool::detail::gpu {

/// Memory kept back because an announced capture may run (pieces not unmapped for want of a
/// device-wide wait): settled once no announced capture may run on its device.
class kept_for_capture {
 public:
  /// Waits for the device and gives back what was kept, or asks again (device_wait) when a
  /// capture may run again. Called without any lock of refpool's held.
  virtual void settle() noexcept = 0;

 protected:
  ~kept_for_capture() = default;
};

/// Devices 0 to counted_devices - 1 are counted; an announcement for another is ignored.
inline constexpr int counted_devices = 64;

/// A capture may run on `device` until the matching capture_over. Waits while a device_wait of
/// the device is held (PyTorch's allocator holds its lock over its waits and its
/// beginAllocateToPool alike). Thread-safe.
void capture_announced(int device) noexcept;
/// The capture announced on `device` is over; when it was the last, whatever was kept for the
/// device's captures is settled, on this thread. False (and nothing done) when no announcement of
/// the device was open. Thread-safe; call it without refpool's locks.
bool capture_over(int device) noexcept;

/// Leave to wait for a whole device: while it is held, no capture is announced on the device, so
/// one announced meanwhile begins after the wait. Hold it over the wait only.
class device_wait {
 public:
  /// Whether the caller may wait for the device now.
  explicit operator bool() const noexcept { return allowed_; }

 private:
  friend device_wait permit_device_wait(int device, kept_for_capture* kept) noexcept;
  bool allowed_ = true;
  std::unique_lock<std::mutex> captures_held_off_;
};
/// Leave to wait for `device`, refused (false) while an announced capture may run on it: then
/// `kept`, unless null, is registered to be settled by the capture_over that leaves the device
/// without announced captures (it must live for the rest of the process, as GPU resources do).
/// Thread-safe.
[[nodiscard]] device_wait permit_device_wait(int device, kept_for_capture* kept) noexcept;

}  // namespace refpool::detail::gpu
