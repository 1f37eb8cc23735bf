// Planned scopes on several streams, on a real GPU: a plan replays only where stream order makes
// it safe. The rule (docs/design.md, "Planned scopes"): a key used on another stream gets an arena
// of its own; an arena is a span of the segment heap, so bytes one arena yielded may later serve
// another, after the heap orders the new stream behind the old one's last use; a region used on another stream through
// record_stream makes the next hand-out of its arena wait for that stream. Each case is checked
// with a kernel that waits 50 ms and then writes (as in cuda_kernel_test.cpp), and each has a
// control half that shows the race it would catch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include <refpool/refpool.hpp>

#include "device_helpers.hpp"

using namespace refpool;
using refpool::test::all_equal;
using refpool::test::download;
using refpool::test::words;

TEST_CASE("a planned key on two streams: a late write on one never lands in the other's region",
          "[cuda][plan][streams]") {
  const backend be = cuda::device(0);
  cuda::stream a;
  cuda::stream b;
  alloc_cache cache{cache_options{}};
  // One step of the loop, on stream s: one buffer, written, released when the scope ends.
  const auto run = [&](cuda::stream& s, bool slowly, std::uint32_t value) {
    scope sc(cache, {.plan = "step"});
    auto x = empty<std::uint32_t>(be, {words}, s);
    if (slowly) {
      refpool::test::fill_late(s, x.data(), words, value);
    } else {
      refpool::test::fill_now(s, x.data(), words, value);
    }
    return x.data();
  };
  // Record and replay the key on both streams.
  for (int i = 0; i < 2; ++i) run(a, false, 0);
  for (int i = 0; i < 2; ++i) run(b, false, 0);
  a.synchronize();
  b.synchronize();
  const auto allocations = be.allocation_count();
  // A's replay starts a 50 ms write and its region is released at once; B's replay follows.
  void* on_a = run(a, true, 1);
  std::vector<std::uint32_t> result;
  void* on_b = nullptr;
  {
    scope sc(cache, {.plan = "step"});
    auto x = empty<std::uint32_t>(be, {words}, b);
    on_b = x.data();
    refpool::test::fill_now(b, x.data(), words, 2);
    b.synchronize();
    a.synchronize();  // A's late write has landed by now, wherever it went
    result = download(x, b);
  }
  CHECK(be.allocation_count() == allocations);  // both replayed from their plans
  CHECK(cache.stats().plans == 2);
  // A's late write never lands in B's region. The regions may overlap (on the H100 they did: B's
  // arena took bytes A's arena had yielded); then the heap made B wait for A's last use of them.
  const bool overlapping = refpool::test::overlap(on_a, std::size_t{words} * 4, on_b, std::size_t{words} * 4);
  CAPTURE(overlapping);
  CHECK(all_equal(result, 2));
  // Control: one buffer written on A (slowly) and on B with nothing ordering them shows the race
  // (the late write of 1 lands last), so a plan handing A's bytes to B would fail the check above.
  CHECK(all_equal(refpool::test::unordered_writes(be, a, b), 1));
}

TEST_CASE("a region used on another stream makes the next run of its arena wait for that stream",
          "[cuda][plan][streams]") {
  const backend be = cuda::device(0);
  cuda::stream a;
  cuda::stream b;
  // Two runs of a key on A: in the first its region is also written on B (slowly), then released;
  // the second gets the same region and writes it on A at once. `record` says whether the first
  // run told refpool about B.
  const auto two_runs = [&](bool record) {
    alloc_cache cache{cache_options{}};
    for (int i = 0; i < 3; ++i) {  // the key seen twice (it becomes a plan) and replayed once, all on A
      scope sc(cache, {.plan = "k"});
      auto x = empty<std::uint32_t>(be, {words}, a);
      refpool::test::fill_now(a, x.data(), words, 0);
    }
    a.synchronize();
    void* first = nullptr;
    {
      scope sc(cache, {.plan = "k"});
      auto x = empty<std::uint32_t>(be, {words}, a);
      first = x.data();
      if (record) x.record_stream(b);
      refpool::test::fill_late(b, x.data(), words, 1);
    }  // released while B still writes
    scope sc(cache, {.plan = "k"});
    auto x = empty<std::uint32_t>(be, {words}, a);
    CHECK(x.data() == first);  // the plan's region again
    refpool::test::fill_now(a, x.data(), words, 2);
    a.synchronize();
    b.synchronize();
    CHECK(cache.stats().plan_hits == 3);
    return download(x, a);
  };
  CHECK(all_equal(two_runs(true), 2));   // A waited for B's write before its own
  CHECK(all_equal(two_runs(false), 1));  // control: without the record, B's late write lands last
}
