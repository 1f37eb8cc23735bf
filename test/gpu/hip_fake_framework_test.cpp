// The framework allocator (the C API PyTorch's hooks call) on the fake HIP runtime, through CUDA
// graph captures as PyTorch makes them: a process of its own, as the framework allocator is
// process-wide. The fake breaks a capture the way the runtimes do (fake_amdhip64.cpp): a
// device-wide wait while a stream of the device captures invalidates the capture.
#define __HIP_DISABLE_CPP_FUNCTIONS__
#include <hip/hip_runtime_api.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>

#include <refpool/refpool.h>

#include "fake_hip/app.hpp"
#include "fake_hip/app_stream.hpp"

using fake_hip::app_stream;
using fake_hip::fake;

namespace {

int same_stream(void* context, void* stream) { return stream == *static_cast<hipStream_t*>(context) ? 1 : 0; }

void* allocate(std::size_t bytes, const app_stream& stream) {
  void* ptr = nullptr;
  REQUIRE(refpool_allocator_alloc(bytes, 0, stream.handle, &ptr) == REFPOOL_OK);
  return ptr;
}

// Capture of `steps` additions on `stream` into private pool `pool`, as CUDAGraph::capture_begin
// and capture_end do (the route begins before the capture, ends after it): each step's output is
// a new allocation, its input freed unless it is `input` (or `free_input`). Returns the output.
void* capture_additions(const app_stream& stream, refpool_pool_id pool, void* input, bool free_input) {
  hipStream_t captured = stream.handle;
  REQUIRE(refpool_allocator_begin_pool(0, pool, same_stream, &captured, nullptr) == REFPOOL_OK);
  stream.begin_capture(hipStreamCaptureModeGlobal);
  void* b = input;
  for (int step = 0; step < 10; ++step) {
    void* next = allocate(4000, stream);
    if (b != input || free_input) REQUIRE(refpool_free(b) == REFPOOL_OK);
    b = next;
  }
  CHECK(stream.end_capture() == hipSuccess);
  REQUIRE(refpool_allocator_end_pool(0, pool) == REFPOOL_OK);
  return b;
}

std::size_t live_pools() {
  std::size_t count = 0;
  REQUIRE(refpool_allocator_pool_ids(nullptr, 0, &count) == REFPOOL_OK);
  return count;
}

// Idle memory in the cache: freed on `stream`, of a segment of its own.
void make_idle(const app_stream& stream) {
  void* idle = allocate(std::size_t{8} << 20, stream);
  REQUIRE(refpool_free(idle) == REFPOOL_OK);
}

// A capture begun by another thread while refpool is about to wait for the device: the fake's
// hook on hipDeviceSynchronize starts it, and lets the wait go on once it has begun, or after half
// a second (refpool may hold the capture's announcement off until its wait is over).
namespace capture_during_wait {
std::atomic<bool> armed{false};
std::atomic<bool> begun{false};
std::atomic<int> failures{0};
hipStream_t stream = nullptr;
std::thread capturer;
void begin_from_another_thread() {
  if (!armed.exchange(false)) return;
  capturer = std::thread([] {  // no Catch2 macro here: Catch2 2 is not thread-safe
    static hipStream_t captured = stream;
    if (refpool_allocator_begin_pool(0, {300, 1}, same_stream, &captured, nullptr) != REFPOOL_OK) ++failures;
    const auto begin_capture = fake_hip::symbol<decltype(::hipStreamBeginCapture)>("hipStreamBeginCapture");
    if (begin_capture(stream, hipStreamCaptureModeGlobal) != hipSuccess) ++failures;
    begun = true;
  });
  for (int waited = 0; waited < 500 && !begun; ++waited) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
}  // namespace capture_during_wait

}  // namespace

TEST_CASE("a graph's pool released while its output lives, the output freed in the next capture", "[hip-7]") {
  // PyTorch's test_graph_capture_reset_recapture: g.reset() releases the first graph's pool while
  // its output b lives; b is freed during the second capture, whose graph still writes it. On the
  // H100, the device-wide wait before unmapping b's memory broke the second capture; then, once
  // that wait waited for the capture's end, the replay wrote unmapped memory.
  refpool_allocator_options options;
  REQUIRE(refpool_allocator_options_init(&options, sizeof options) == REFPOOL_OK);
  options.runtime = REFPOOL_RUNTIME_HIP;
  REQUIRE(refpool_allocator_configure(&options, sizeof options, nullptr, 0) == REFPOOL_OK);
  void* first = nullptr;  // loads the runtime, as PyTorch's first tensor does
  REQUIRE(refpool_allocator_alloc(256, 0, nullptr, &first) == REFPOOL_OK);
  app_stream s;
  fake().clear_violations();
  void* a = allocate(4000, s);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  void* b = capture_additions(s, {1, 1}, a, false);
  REQUIRE(refpool_allocator_release_pool(0, {1, 1}) == REFPOOL_OK);  // g.reset(); b lives on
  fake().clear_calls();
  void* b2 = capture_additions(s, {2, 1}, b, true);
  CHECK(fake().violations().empty());
  // The second graph writes b when it replays: b's memory stays mapped after its capture (the
  // released pool keeps it until empty_cache, as PyTorch's allocator does).
  CHECK(fake_hip::count_calls(fake().calls(), "hipMemUnmap") == 0);
  REQUIRE(refpool_allocator_release_pool(0, {2, 1}) == REFPOOL_OK);
  REQUIRE(refpool_free(b2) == REFPOOL_OK);
  REQUIRE(refpool_free(a) == REFPOOL_OK);
  REQUIRE(refpool_free(first) == REFPOOL_OK);
  // After the captures, emptying the cache gives the device everything, the kept memory too.
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  CHECK(fake().device_bytes_in_use(0) == 0);
  CHECK(fake().violations().empty());
}

TEST_CASE("emptying the cache while a capture runs keeps what needs a wait, until the capture ends", "[hip-7]") {
  // torch.cuda.empty_cache() from another thread during a capture (or inside use_mem_pool): the
  // idle segments cannot be unmapped without a device-wide wait, which would break the capture.
  app_stream s;
  app_stream other;
  void* idle = allocate(std::size_t{8} << 20, other);
  REQUIRE(refpool_free(idle) == REFPOOL_OK);
  const std::size_t held = fake().device_bytes_in_use(0);
  REQUIRE(held >= std::size_t{8} << 20);
  fake().clear_violations();
  hipStream_t captured = s.handle;
  hipStream_t pooled = other.handle;  // a second route (use_mem_pool on another thread), no capture
  REQUIRE(refpool_allocator_begin_pool(0, {3, 1}, same_stream, &captured, nullptr) == REFPOOL_OK);
  REQUIRE(refpool_allocator_begin_pool(0, {4, 1}, same_stream, &pooled, nullptr) == REFPOOL_OK);
  s.begin_capture(hipStreamCaptureModeGlobal);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  CHECK(s.end_capture() == hipSuccess);
  CHECK(fake().device_bytes_in_use(0) == held);  // kept, mapped
  REQUIRE(refpool_allocator_end_pool(0, {3, 1}) == REFPOOL_OK);
  CHECK(fake().device_bytes_in_use(0) == held);  // a route is still open
  REQUIRE(refpool_allocator_end_pool(0, {4, 1}) == REFPOOL_OK);
  CHECK(fake().device_bytes_in_use(0) == 0);  // the last route's end gave it back
  REQUIRE(refpool_allocator_release_pool(0, {3, 1}) == REFPOOL_OK);
  REQUIRE(refpool_allocator_release_pool(0, {4, 1}) == REFPOOL_OK);
  CHECK(fake().violations().empty());
}

TEST_CASE("running out of memory during a capture drops no released pool: the capture may use its freed memory",
          "[hip-7]") {
  // test_graph_capture_reset_recapture again, but the second capture runs out of memory after b
  // was freed into the first graph's released pool. PyTorch's allocator frees released graph
  // pools only while no capture is underway; dropping the pool here unmaps b at the route's end,
  // and the second graph's replay writes unmapped memory.
  app_stream s;
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  fake().clear_violations();
  void* a = allocate(4000, s);
  void* b = capture_additions(s, {5, 1}, a, false);
  REQUIRE(refpool_allocator_release_pool(0, {5, 1}) == REFPOOL_OK);
  hipStream_t captured = s.handle;
  REQUIRE(refpool_allocator_begin_pool(0, {6, 1}, same_stream, &captured, nullptr) == REFPOOL_OK);
  s.begin_capture(hipStreamCaptureModeGlobal);
  void* c = allocate(4000, s);
  REQUIRE(refpool_free(b) == REFPOOL_OK);  // the graph being captured used b: its replay writes it
  fake().clear_calls();
  REQUIRE(refpool_allocator_set_device_limit(0, fake().device_bytes_in_use(0)) == REFPOOL_OK);
  void* refused = nullptr;
  CHECK(refpool_allocator_alloc(std::size_t{16} << 20, 0, s.handle, &refused) == REFPOOL_ERROR_OUT_OF_MEMORY);
  REQUIRE(refpool_allocator_set_device_limit(0, SIZE_MAX) == REFPOOL_OK);
  refpool_cache first_pool{};
  CHECK(refpool_allocator_pool_cache({5, 1}, &first_pool) == REFPOOL_OK);  // the released pool keeps b's memory
  if (first_pool.id != 0) REQUIRE(refpool_cache_destroy(first_pool) == REFPOOL_OK);
  CHECK(s.end_capture() == hipSuccess);
  REQUIRE(refpool_allocator_end_pool(0, {6, 1}) == REFPOOL_OK);
  CHECK(fake_hip::count_calls(fake().calls(), "hipMemUnmap") == 0);
  CHECK(fake().violations().empty());
  REQUIRE(refpool_free(c) == REFPOOL_OK);
  REQUIRE(refpool_free(a) == REFPOOL_OK);
  REQUIRE(refpool_allocator_release_pool(0, {6, 1}) == REFPOOL_OK);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);  // no capture now: both pools go
  CHECK(live_pools() == 0);
  CHECK(fake().device_bytes_in_use(0) == 0);
}

TEST_CASE("an end that matches no route is refused and ends no announced capture", "[hip-7]") {
  app_stream s;
  app_stream other;
  make_idle(other);
  fake().clear_violations();
  hipStream_t captured = s.handle;
  REQUIRE(refpool_allocator_begin_pool(0, {7, 1}, same_stream, &captured, nullptr) == REFPOOL_OK);
  s.begin_capture(hipStreamCaptureModeGlobal);
  CHECK(refpool_allocator_end_pool(0, {8, 1}) == REFPOOL_ERROR_INVALID_ARGUMENT);  // never begun
  CHECK(refpool_allocator_end_pool(1, {7, 1}) == REFPOOL_ERROR_INVALID_ARGUMENT);  // begun on device 0
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);  // still announced: no device-wide wait
  CHECK(s.end_capture() == hipSuccess);
  CHECK(fake().device_bytes_in_use(0) > 0);
  REQUIRE(refpool_allocator_end_pool(0, {7, 1}) == REFPOOL_OK);
  CHECK(fake().device_bytes_in_use(0) == 0);
  REQUIRE(refpool_allocator_release_pool(0, {7, 1}) == REFPOOL_OK);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  CHECK(fake().violations().empty());
}

TEST_CASE("a refused begin announces no capture: memory given back after the route waits for the device", "[hip-7]") {
  app_stream s;
  hipStream_t captured = s.handle;
  REQUIRE(refpool_allocator_begin_pool(0, {9, 1}, same_stream, &captured, nullptr) == REFPOOL_OK);
  CHECK(refpool_allocator_begin_pool(0, {9, 1}, same_stream, &captured, nullptr) == REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(refpool_allocator_begin_pool(0, {9, 2}, nullptr, &captured, nullptr) == REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(refpool_allocator_begin_pool(0, {0, 0}, same_stream, &captured, nullptr) == REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(refpool_allocator_begin_pool(64, {9, 3}, same_stream, &captured, nullptr) == REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(refpool_allocator_begin_pool(-1, {9, 3}, same_stream, &captured, nullptr) == REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(refpool_allocator_end_pool(64, {9, 3}) == REFPOOL_ERROR_INVALID_ARGUMENT);
  REQUIRE(refpool_allocator_end_pool(0, {9, 1}) == REFPOOL_OK);
  REQUIRE(refpool_allocator_release_pool(0, {9, 1}) == REFPOOL_OK);
  make_idle(s);
  fake().clear_calls();
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);  // no capture announced: waits and unmaps now
  CHECK(fake_hip::count_calls(fake().calls(), "hipDeviceSynchronize") >= 1);
  CHECK(fake().device_bytes_in_use(0) == 0);
}

TEST_CASE("captures begun and ended on one thread while another empties the cache: no capture broken, nothing kept",
          "[hip-7]") {
  // PyTorch's allocator holds its lock over its device-wide waits and over beginAllocateToPool, so
  // a capture never begins while it waits. Here one thread captures into a new pool again and
  // again (route, capture, allocation, end, release, empty_cache) while another makes idle memory
  // and empties the cache. Out of memory is allowed (the fake's 256 MiB fill with what captures
  // keep mapped); a broken capture, a failed end or memory kept after the last route is not.
  app_stream s;
  app_stream other;
  fake().clear_violations();
  const auto begin_capture = fake_hip::symbol<decltype(::hipStreamBeginCapture)>("hipStreamBeginCapture");
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::atomic<int> out_of_memory{0};
  const auto allocate_and_free = [&](std::size_t bytes, hipStream_t stream) {
    void* p = nullptr;
    const refpool_status allocated = refpool_allocator_alloc(bytes, 0, stream, &p);
    if (allocated == REFPOOL_ERROR_OUT_OF_MEMORY) ++out_of_memory;
    if ((allocated != REFPOOL_OK && allocated != REFPOOL_ERROR_OUT_OF_MEMORY) || refpool_free(p) != REFPOOL_OK)
      ++failures;
  };
  std::thread capturer([&] {  // no Catch2 macro here: Catch2 2 is not thread-safe
    hipStream_t captured = s.handle;
    for (std::uint64_t round = 1; round <= 300; ++round) {
      const refpool_pool_id pool{100, round};
      if (refpool_allocator_begin_pool(0, pool, same_stream, &captured, nullptr) != REFPOOL_OK) ++failures;
      if (begin_capture(s.handle, hipStreamCaptureModeGlobal) != hipSuccess) ++failures;
      allocate_and_free(std::size_t{3} << 20, s.handle);
      if (s.end_capture() != hipSuccess) ++failures;
      if (refpool_allocator_end_pool(0, pool) != REFPOOL_OK) ++failures;
      if (refpool_allocator_release_pool(0, pool) != REFPOOL_OK) ++failures;
      if (refpool_allocator_empty_cache() != REFPOOL_OK) ++failures;
    }
    done = true;
  });
  int emptied = 0;
  while (!done) {
    allocate_and_free(std::size_t{2} << 20, other.handle);
    if (refpool_allocator_empty_cache() != REFPOOL_OK) ++failures;
    ++emptied;
  }
  capturer.join();
  INFO(emptied << " empty_cache calls beside the captures, " << out_of_memory << " requests out of memory");
  CHECK(failures == 0);
  CHECK(fake().violations().empty());
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  CHECK(live_pools() == 0);
  CHECK(fake().device_bytes_in_use(0) == 0);
}

TEST_CASE("a capture announced while refpool waits for the device is not broken by that wait", "[hip-7]") {
  // PyTorch's allocator holds its lock over its device-wide waits and over beginAllocateToPool, so
  // no capture begins between its check and its wait. Here empty_cache finds no capture announced
  // and is about to wait for the device when another thread begins a route and its capture.
  namespace race = capture_during_wait;
  app_stream s;
  app_stream other;
  make_idle(other);
  fake().clear_violations();
  race::stream = s.handle;
  race::armed = true;
  fake().before_calls("hipDeviceSynchronize", race::begin_from_another_thread);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  fake().before_calls("hipDeviceSynchronize", nullptr);
  REQUIRE(race::capturer.joinable());
  race::capturer.join();
  CHECK(race::failures == 0);
  CHECK(s.end_capture() == hipSuccess);
  CHECK(fake().violations().empty());
  REQUIRE(refpool_allocator_end_pool(0, {300, 1}) == REFPOOL_OK);
  REQUIRE(refpool_allocator_release_pool(0, {300, 1}) == REFPOOL_OK);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  CHECK(fake().device_bytes_in_use(0) == 0);
}

TEST_CASE("a program's own capture, announced (refpool_capture_begin): no wait breaks it, the last end gives back",
          "[hip-7]") {
  // A program capturing a graph on its own stream (no private pool: CuPy, or a C++ program with
  // refpool as its allocator) while another thread empties the cache.
  app_stream s;
  app_stream other;
  make_idle(other);
  const std::size_t held = fake().device_bytes_in_use(0);
  fake().clear_violations();
  REQUIRE(refpool_capture_begin(0) == REFPOOL_OK);
  REQUIRE(refpool_capture_begin(0) == REFPOOL_OK);  // a second capture, on another stream
  s.begin_capture(hipStreamCaptureModeGlobal);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  CHECK(s.end_capture() == hipSuccess);
  CHECK(fake().violations().empty());
  CHECK(fake().device_bytes_in_use(0) == held);  // kept, mapped
  REQUIRE(refpool_capture_end(0) == REFPOOL_OK);
  CHECK(fake().device_bytes_in_use(0) == held);  // one announcement is still open
  REQUIRE(refpool_capture_end(0) == REFPOOL_OK);
  CHECK(fake().device_bytes_in_use(0) == 0);  // the last end waited for the device and gave it back
  CHECK(refpool_capture_end(0) == REFPOOL_ERROR_INVALID_ARGUMENT);  // none open
  CHECK(refpool_capture_begin(64) == REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(refpool_capture_end(-1) == REFPOOL_ERROR_INVALID_ARGUMENT);
  // An unmatched end does not end the capture a private pool's route announced.
  hipStream_t captured = s.handle;
  REQUIRE(refpool_allocator_begin_pool(0, {400, 1}, same_stream, &captured, nullptr) == REFPOOL_OK);
  make_idle(other);
  s.begin_capture(hipStreamCaptureModeGlobal);
  CHECK(refpool_capture_end(0) == REFPOOL_ERROR_INVALID_ARGUMENT);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  CHECK(s.end_capture() == hipSuccess);
  CHECK(fake().violations().empty());
  REQUIRE(refpool_allocator_end_pool(0, {400, 1}) == REFPOOL_OK);
  REQUIRE(refpool_allocator_release_pool(0, {400, 1}) == REFPOOL_OK);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  CHECK(fake().device_bytes_in_use(0) == 0);
}
