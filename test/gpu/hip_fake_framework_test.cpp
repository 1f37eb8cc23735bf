// The framework allocator (the C API PyTorch's hooks call) on the fake HIP runtime, through CUDA
// graph captures as PyTorch makes them: a process of its own, as the framework allocator is
// process-wide. The fake breaks a capture the way the runtimes do (fake_amdhip64.cpp): a
// device-wide wait while a stream of the device captures invalidates the capture.
#define __HIP_DISABLE_CPP_FUNCTIONS__
#include <hip/hip_runtime_api.h>

#include <catch2/catch.hpp>

#include <cstddef>

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
