// Segments on several streams, on a real GPU: a piece carved from bytes that another stream may
// still write waits for that stream, also when coalescing joined pieces last used on different
// streams (docs/design.md, "Segments"). Each case is checked with a kernel that waits 50 ms and
// then writes (as in cuda_kernel_test.cpp), and the control shows the race it would catch.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include <refpool/refpool.hpp>

#include "device_helpers.hpp"

using namespace refpool;
using refpool::test::all_equal;
using refpool::test::download;
using refpool::test::overlap;
using refpool::test::words;

namespace {

cache_options segments_on() {
  cache_options options;
  options.segments = segment_policy::on;
  return options;
}

}  // namespace

TEST_CASE("segments: a piece released during a late write on A and carved for B waits for A",
          "[cuda][segments][streams]") {
  const backend be = cuda::device(0);
  cuda::stream a;
  cuda::stream b;
  alloc_cache cache{segments_on()};
  scope sc(cache);
  auto x = empty<std::uint32_t>(be, {words}, a);
  const void* first = x.data();
  refpool::test::fill_late(a, x.data(), words, 1);
  x = {};  // idle while A still writes
  // Another size, so no exact-key hit: the idle piece goes back to its segment and best fit
  // carves the new piece from the same bytes.
  auto y = empty<std::uint32_t>(be, {words / 2 * 3}, b);
  REQUIRE(overlap(first, std::size_t{words} * 4, y.data(), y.bytes()));
  refpool::test::fill_now(b, y.data(), words / 2 * 3, 2);
  b.synchronize();
  a.synchronize();
  CHECK(all_equal(download(y, b), 2));  // B's write came after A's
  CHECK(cache.stats().cross_stream_reuses >= 1);
}

TEST_CASE("segments: pieces last used on A and on C, coalesced and carved for B, wait for both",
          "[cuda][segments][streams]") {
  const backend be = cuda::device(0);
  cuda::stream a;
  cuda::stream b;
  cuda::stream c;
  alloc_cache cache{segments_on()};
  scope sc(cache);
  auto x1 = empty<std::uint32_t>(be, {words}, a);
  auto x2 = empty<std::uint32_t>(be, {words}, c);
  const void* p1 = x1.data();
  const void* p2 = x2.data();
  refpool::test::fill_late(a, x1.data(), words, 1);
  refpool::test::fill_late(c, x2.data(), words, 3);
  x1 = {};
  x2 = {};
  auto y = empty<std::uint32_t>(be, {2 * words}, b);  // the two pieces joined, or more
  REQUIRE(overlap(p1, std::size_t{words} * 4, y.data(), y.bytes()));
  REQUIRE(overlap(p2, std::size_t{words} * 4, y.data(), y.bytes()));
  refpool::test::fill_now(b, y.data(), 2 * words, 2);
  b.synchronize();
  a.synchronize();
  c.synchronize();
  CHECK(all_equal(download(y, b), 2));  // B waited for A and for C
}

TEST_CASE("segments: the race the waits prevent (control)", "[cuda][segments][streams]") {
  // A cache that carved A's bytes for B without a wait would show this: A's late write lands last.
  cuda::stream a;
  cuda::stream b;
  alloc_cache cache{segments_on()};
  scope sc(cache);
  CHECK(all_equal(refpool::test::unordered_writes(cuda::device(0), a, b), 1));
}

TEST_CASE("segments: reclaim unmaps a range only after the work in flight on it is done",
          "[cuda][segments][streams]") {
  // The device-wide wait before cuMemUnmap (virtual_memory.cpp). A late write on B, recorded on
  // the buffer, is still running when reclaim decommits the buffer's bytes: without the wait the
  // write lands in unmapped memory, the context reports an illegal address, and B's synchronize
  // throws. (With CUDA 13 headers the driver table once resolved cuCtxSynchronize to its _v2,
  // which takes a context: called without one it waited for nothing.)
  const backend be = cuda::device(0);
  cuda::stream a;
  cuda::stream b;
  alloc_cache cache{segments_on()};
  {
    scope sc(cache);
    auto x = empty<std::uint32_t>(be, {words}, a);
    x.record_stream(b);
    refpool::test::fill_late(b, x.data(), words, 1);
  }  // x idle while B still writes into it
  const auto before = cache.stats();
  REQUIRE(before.segment_bytes > 0);
  cache.reclaim();
  const auto after = cache.stats();
  REQUIRE(after.segment_trims > before.segment_trims);  // bytes were decommitted
  CHECK(after.segment_bytes < before.segment_bytes);
  CHECK_NOTHROW(b.synchronize());
  CHECK_NOTHROW(a.synchronize());
}
