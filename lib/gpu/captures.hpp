// Graph captures that a framework announced: while one may run on a device, refpool never waits
// for the whole device. A device-wide wait (cuCtxSynchronize, hipDeviceSynchronize) while any
// stream of the device captures fails and invalidates that capture, whatever the thread's capture
// mode, and no driver call says whether some stream of a device captures. The framework allocator
// announces each route to a private pool (PyTorch's beginAllocateToPool .. endAllocateToPool, which
// brackets every CUDA graph capture, and use_mem_pool).
#pragma once

namespace refpool::detail::gpu {

/// Memory kept back because an announced capture may run (pieces not unmapped for want of a
/// device-wide wait): settled once no announced capture may run on its device.
class kept_for_capture {
 public:
  /// Waits for the device and gives back what was kept, or asks again (settle_later) when a
  /// capture may run again. Called without any lock of refpool's held.
  virtual void settle() noexcept = 0;

 protected:
  ~kept_for_capture() = default;
};

/// A capture may run on `device` until the matching capture_over. Thread-safe.
void capture_announced(int device) noexcept;
/// The capture announced on `device` is over; when it was the last, whatever was kept for the
/// device's captures is settled, on this thread. Thread-safe; call it without refpool's locks.
void capture_over(int device) noexcept;
/// Whether an announced capture may be running on `device`. Thread-safe.
bool capture_may_run(int device) noexcept;
/// While an announced capture may run on `device`: registers `kept` to be settled by the
/// capture_over that leaves the device without announced captures, and returns true. Otherwise
/// false (the caller may wait for the device now). `kept` must live for the rest of the process
/// (GPU resources do). Thread-safe.
bool settle_later(int device, kept_for_capture& kept) noexcept;

}  // namespace refpool::detail::gpu
