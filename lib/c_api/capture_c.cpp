// refpool_capture_begin / refpool_capture_end (refpool.h, "graph captures refpool does not
// route"): a program's own graph captures, announced as the framework allocator announces its
// private pools' routes (gpu/captures.hpp), so that refpool makes no device-wide wait during them.
#include <array>
#include <atomic>
#include <cstddef>

#include <fmt/format.h>

#include "c_api/support.hpp"
#include "gpu/captures.hpp"

using namespace refpool::c_api;
namespace gpu = refpool::detail::gpu;

namespace {

// The announcements made through this API, per device, apart from the framework allocator's own:
// an unmatched refpool_capture_end must not end a capture a private pool's route announced.
std::array<std::atomic<int>, std::size_t{gpu::counted_devices}> program_captures{};

void check_device(int device, const char* function) {
  if (device < 0 || device >= gpu::counted_devices)
    fail(REFPOOL_ERROR_INVALID_ARGUMENT,
         fmt::format("refpool: {}: device {} is outside 0 to {}, the devices whose captures refpool counts", function,
                     device, gpu::counted_devices - 1));
}

}  // namespace

extern "C" {

refpool_status refpool_capture_begin(int device) {
  return guarded([&] {
    check_device(device, "refpool_capture_begin");
    gpu::capture_announced(device);  // before it counts here: an end that sees it finds the device's count above 0
    program_captures[static_cast<std::size_t>(device)].fetch_add(1, std::memory_order_release);
  });
}

refpool_status refpool_capture_end(int device) {
  return guarded([&] {
    check_device(device, "refpool_capture_end");
    std::atomic<int>& open = program_captures[static_cast<std::size_t>(device)];
    int count = open.load(std::memory_order_acquire);
    do {
      if (count == 0)
        fail(REFPOOL_ERROR_INVALID_ARGUMENT,
             fmt::format("refpool: refpool_capture_end: no capture of device {} is announced (each "
                         "refpool_capture_begin takes one refpool_capture_end)",
                         device));
    } while (!open.compare_exchange_weak(count, count - 1, std::memory_order_acq_rel, std::memory_order_acquire));
    (void)gpu::capture_over(device);  // ours was open, so the device's count is above 0
  });
}

}  // extern "C"
