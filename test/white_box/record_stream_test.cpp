// record_stream (PyTorch's Tensor.record_stream, refpool_allocator_record_stream): a stream recorded
// on a buffer may still use it after its last release, so wherever the memory goes next (another
// request, a segment's free range, the backend) that stream's work must come first. Host memory
// with the tracking adaptor of test/white_box/segment_fixture.hpp, which sees every ordering and
// every free; the streams are plain handles.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <refpool/refpool.hpp>

#include "access.hpp"
#include "cache/cache_state.hpp"
#include "white_box/segment_fixture.hpp"

using namespace refpool;
using refpool::test::heap_fixture;
using refpool::test::KiB;
using refpool::test::MiB;
using refpool::test::stream;

namespace {

cache_options segments(segment_policy p) {
  cache_options o;
  o.segments = p;
  return o;
}

bool ordered(const heap_fixture& f, stream_ref producer, stream_ref consumer) {
  const auto orders = f.tracker->orders();
  return std::find(orders.begin(), orders.end(), std::pair{producer, consumer}) != orders.end();
}

}  // namespace

TEST_CASE("record_stream: a whole block reclaimed is freed after the recorded stream's work",
          "[record_stream][streams]") {
  // Without segments every block is one backend allocation, freed on its last stream
  // (cuMemFreeAsync for device_async memory): the recorded stream must be ordered before that.
  heap_fixture f;
  alloc_cache cache{segments(segment_policy::off)};
  {
    data_ref x = cache.allocate(f.be, 4 * MiB, stream(1));
    x.record_stream(stream(2));
  }
  f.tracker->clear_orders();
  CHECK(cache.reclaim(0) == 4 * MiB);
  REQUIRE(f.tracker->deallocation_streams() == std::vector<stream_ref>{stream(1)});
  CHECK(ordered(f, stream(2), stream(1)));
  CHECK(f.tracker->orders().size() == 1);
}

TEST_CASE("record_stream: a direct block is freed after the recorded stream's work", "[record_stream][streams]") {
  heap_fixture f;
  {
    data_ref x = allocate(f.be, 64 * KiB, stream(1));  // no scope: straight from the backend
    x.record_stream(stream(2));
    x.record_stream(stream(3));
    x.record_stream(stream(1));  // its own stream: nothing to order
  }
  REQUIRE(f.tracker->deallocation_streams() == std::vector<stream_ref>{stream(1)});
  CHECK(ordered(f, stream(2), stream(1)));
  CHECK(ordered(f, stream(3), stream(1)));
  CHECK(f.tracker->orders().size() == 2);
}

TEST_CASE("record_stream: a piece given back keeps the recorded stream on its free range",
          "[record_stream][streams][segments]") {
  // Small pieces share one 2 MiB commit, so the freed piece's bytes stay committed and free.
  heap_fixture f;
  alloc_cache cache{segments(segment_policy::on)};
  data_ref x = cache.allocate(f.be, 512 * KiB, stream(1));
  auto keep = cache.allocate(f.be, 512 * KiB, stream(9));
  const void* at = x.data();
  x.record_stream(stream(2));
  x.reset();
  cache.reclaim(0);  // back to the heap, not to the backend: the commit holds `keep`
  CHECK(cache.stats().idle_bytes == 0);
  CHECK(f.tracker->decommits() == 0);
  f.tracker->clear_orders();
  auto y = cache.allocate(f.be, 512 * KiB, stream(5));  // best fit: x's bytes
  REQUIRE(y.data() == at);
  CHECK(ordered(f, stream(1), stream(5)));
  CHECK(ordered(f, stream(2), stream(5)));
  CHECK(f.tracker->orders().size() == 2);
  detail::access::state(cache).check_segments();
}

TEST_CASE("record_stream: PyTorch's test_caching_allocator_record_stream_oom, then the next test's requests",
          "[record_stream][streams][segments]") {
  // Its sequence, as the hooks drive the framework allocator: pointers handed over and freed by
  // address, record_stream through pointer_ref, empty_cache as reclaim(0). Each buffer is written
  // after each stage: a piece whose bytes were decommitted under a live buffer faults (host
  // virtual memory maps decommitted bytes PROT_NONE). Sizes scaled down from 160 MiB.
  heap_fixture f(std::size_t{4} << 30);
  alloc_cache cache{segments(segment_policy::on)};
  const stream_ref current = stream(11);  // the test's non-default stream (CudaNonDefaultStream)
  const stream_ref side = stream(12);
  constexpr std::size_t big = 40 * MiB;
  void* y = to_pointer(cache.allocate(f.be, big, side));
  std::memset(y, 0, big);
  void* first_x = nullptr;
  for (int i = 0; i < 20; ++i) {
    f.tracker->clear_orders();
    void* x = to_pointer(cache.allocate(f.be, big, current));
    if (i == 0) first_x = x;
    // The block x had last round: reused for the current stream after the side stream's work.
    CHECK(x == first_x);
    if (i > 0) CHECK(ordered(f, side, current));
    std::memset(x, i, big);      // y += x on the side stream reads it
    std::memset(y, i + 1, big);  // and writes y
    pointer_ref(x).record_stream(side);
    free_pointer(x);
  }
  CHECK(cache.reclaim(0) >= big);  // torch.cuda.empty_cache(): x's bytes go back to the device
  std::memset(y, 3, big);          // y is live: its bytes stay
  free_pointer(y);                 // the test ends
  // The next test, on a new stream: a small tensor, then a cuBLAS workspace.
  const stream_ref next = stream(13);
  void* a = to_pointer(cache.allocate(f.be, 196, next));
  std::memset(a, 4, 196);
  void* workspace = to_pointer(cache.allocate(f.be, 32 * MiB, next));
  std::memset(workspace, 5, 32 * MiB);
  CHECK(ordered(f, side, next));  // the workspace reuses y's bytes, last used on the side stream
  free_pointer(workspace);
  free_pointer(a);
  detail::access::state(cache).check_segments();
  cache.reclaim(0);
  CHECK(f.tracker->held() == 0);
}
