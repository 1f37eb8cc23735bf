// A take at an address (detail::take_idle_at, lib/api/take_at.hpp; refpool_allocator_pool_take's
// work): a cache hands out again, at their address, idle bytes it handed out before. Cache-level
// allocations on real host memory, with plain blocks and with segments (white-box: the heaps are
// checked against the cache's blocks after each step). The C entry point's test is
// test/c/framework_pool_take_test.c.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <refpool/refpool.hpp>

#include "access.hpp"
#include "api/take_at.hpp"
#include "cache/cache_state.hpp"
#include "white_box/segment_fixture.hpp"
#include "white_box/take_at_support.hpp"

using namespace refpool;
using refpool::test::check_books;
using refpool::test::heap_fixture;
using refpool::test::KiB;
using refpool::test::take;
using refpool::test::take_counts;

namespace {

void* at(const data_ref& r) { return r.data(); }

}  // namespace

TEST_CASE("take at: a freed block comes back at its address, counted as before its free", "[take_at][cache]") {
  const segment_policy policy = GENERATE(segment_policy::off, segment_policy::on);
  INFO("segments " << (policy == segment_policy::on ? "on" : "off"));
  heap_fixture f;
  alloc_cache cache{refpool::test::take_at_options(policy)};
  data_ref a = cache.allocate(f.be, 4 * KiB);
  data_ref b = cache.allocate(f.be, 4 * KiB);
  data_ref c = cache.allocate(f.be, 4 * KiB);
  void* const freed = at(b);
  const cache_stats before = cache.stats();
  b.reset();
  CHECK(cache.stats().live_bytes == before.live_bytes - 4 * KiB);

  b = take(cache, f.be, freed, 4 * KiB);
  CHECK(at(b) == freed);
  CHECK(b.bytes() == 4 * KiB);
  std::memset(b.data(), 1, 4 * KiB);
  cache_stats st = cache.stats();
  CHECK(st.live_bytes == before.live_bytes);
  CHECK(st.live_blocks == before.live_blocks);
  CHECK(st.idle_blocks == 0);
  CHECK(st.held_bytes == before.held_bytes);
  CHECK(st.hits == before.hits + 1);  // the idle block itself: a hit
  check_books(cache, f.be);

  SECTION("live bytes are refused, and nothing changes") {
    const take_counts unchanged(cache.stats());
    CHECK_THROWS_WITH(take(cache, f.be, at(a), 4 * KiB),
                      Catch::Contains("take: ") && Catch::Contains(policy == segment_policy::on ? "in use" : "not"));
    CHECK(take_counts(cache.stats()) == unchanged);
    check_books(cache, f.be);
  }
  SECTION("a block freed on another thread's slot moves to the taker's, as a steal") {
    void* theirs = nullptr;
    std::thread([&] {
      data_ref x = cache.allocate(f.be, 8 * KiB);
      theirs = at(x);
    }).join();  // freed into that thread's slot
    const std::uint64_t steals = cache.stats().steals;
    data_ref x = take(cache, f.be, theirs, 8 * KiB);
    CHECK(at(x) == theirs);
    CHECK(cache.stats().steals == steals + 1);
    x.reset();  // back into this thread's slot
    CHECK(cache.stats().idle_blocks == 1);
    check_books(cache, f.be);
  }
  SECTION("errors: no address, no bytes, a null backend, bytes that are not the cache's") {
    CHECK_THROWS_AS(take(cache, f.be, nullptr, 4 * KiB), invalid_argument);
    CHECK_THROWS_AS(take(cache, f.be, freed, 0), invalid_argument);
    CHECK_THROWS_AS(take(cache, backend{}, freed, 4 * KiB), invalid_argument);
    int local = 0;
    CHECK_THROWS_WITH(take(cache, f.be, &local, sizeof local), Catch::Contains("not the pool's"));
  }
}

TEST_CASE("take at: with segments, freed neighbours that joined in the heap are carved again at their addresses",
          "[take_at][segments]") {
  heap_fixture f;
  alloc_cache cache{refpool::test::take_at_options(segment_policy::on)};
  const std::size_t big = 1024 * KiB;  // large pieces, halves too: a large miss gives the idle ones back first
  data_ref a = cache.allocate(f.be, big);
  data_ref b = cache.allocate(f.be, big);
  data_ref c = cache.allocate(f.be, big);
  void* const at_a = at(a);
  void* const at_b = at(b);
  REQUIRE(static_cast<char*>(at_b) == static_cast<char*>(at_a) + big);
  const cache_stats before = cache.stats();
  a.reset();
  b.reset();
  data_ref other = cache.allocate(f.be, 3 * big);  // a and b go back to the heap and join; other goes elsewhere
  CHECK(cache.stats().idle_blocks == 0);
  const std::size_t free_before = cache.stats().segment_free_bytes;
  check_books(cache, f.be);

  b = take(cache, f.be, at_b, big);
  check_books(cache, f.be);
  a = take(cache, f.be, at_a, big);
  check_books(cache, f.be);
  CHECK(at(a) == at_a);
  CHECK(at(b) == at_b);
  cache_stats st = cache.stats();
  CHECK(st.live_bytes == before.live_bytes + 3 * big);
  CHECK(st.live_blocks == before.live_blocks + 1);
  CHECK(st.segment_free_bytes == free_before - 2 * big);
  CHECK(st.misses == before.misses + 1 + 2);  // other's, and the two carves

  SECTION("bytes partly live: refused, and nothing changes") {
    b.reset();  // idle, with c live after it
    const take_counts unchanged(cache.stats());
    CHECK_THROWS_WITH(take(cache, f.be, at_b, 2 * big), Catch::Contains("in use"));
    CHECK(take_counts(cache.stats()) == unchanged);
    check_books(cache, f.be);
    b = take(cache, f.be, at_b, big);  // still the idle piece: a hit
    CHECK(cache.stats().hits == unchanged.hits + 1);
  }
  SECTION("an idle piece taken smaller: the rest of it is free again") {
    b.reset();
    b = take(cache, f.be, at_b, big / 2);
    CHECK(at(b) == at_b);
    data_ref rest = take(cache, f.be, static_cast<char*>(at_b) + big / 2, big / 2);
    check_books(cache, f.be);
    CHECK(cache.stats().live_bytes == before.live_bytes + 3 * big);
  }
  check_books(cache, f.be);
}

TEST_CASE("take at under threads: one thread takes idle blocks back while another allocates and frees",
          "[take_at][threads]") {
  const segment_policy policy = GENERATE(segment_policy::off, segment_policy::on);
  heap_fixture f;
  alloc_cache cache{refpool::test::take_at_options(policy)};
  std::atomic<bool> done{false};
  std::thread churn([&] {
    std::mt19937 rng(7);
    std::vector<data_ref> held(8);
    while (!done.load(std::memory_order_relaxed)) {
      data_ref& slot = held[rng() % held.size()];
      slot = cache.allocate(f.be, (1 + rng() % 3) * 4 * KiB);  // the taker's size too: steals race takes
      std::memset(slot.data(), 0x3C, slot.bytes());
    }
  });
  int taken = 0;
  int refused = 0;
  for (int i = 0; i < 2000; ++i) {
    data_ref mine = cache.allocate(f.be, 4 * KiB);
    void* const address = at(mine);
    mine.reset();
    try {
      mine = take(cache, f.be, address, 4 * KiB);
      REQUIRE(at(mine) == address);
      std::memset(mine.data(), 0x5A, 4 * KiB);
      ++taken;
    } catch (const invalid_argument&) {
      ++refused;  // the churning thread got those bytes first
    }
  }
  done = true;
  churn.join();
  INFO(taken << " taken, " << refused << " refused");
  CHECK(taken > 0);
  check_books(cache, f.be);
  CHECK(cache.stats().live_blocks == 0);
}
