// A cache with segments (cache_options::segments): misses carve pieces from the backend's
// segment heap, and every piece is a cached block with its own count. These tests run on real
// host memory through the host's virtual memory (or plain segments where the backend offers
// none), with the adaptors of test/white_box/segment_fixture.hpp watching every backend call. The rules
// are docs/design.md's "Segments".
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <refpool/refpool.hpp>
#include "support/fault_injection.hpp"

#include "access.hpp"
#include "cache/cache_state.hpp"
#include "white_box/segment_fixture.hpp"

using namespace refpool;
using refpool::test::heap_fixture;
using refpool::test::KiB;
using refpool::test::MiB;
using refpool::test::stream;

namespace {

cache_options with_segments(segment_policy p = segment_policy::on) {
  cache_options o;
  o.segments = p;
  return o;
}

std::uintptr_t at(const data_ref& r) { return reinterpret_cast<std::uintptr_t>(r.data()); }

/// The heaps are consistent, their pieces are exactly the cache's blocks, and the backend's
/// bytes are the cache's: held bytes plus the segments' free bytes (plus `uncached`: plain
/// blocks, or arenas' spans, which are segment bytes in no cached block).
void check_books(const alloc_cache& cache, const backend& be, std::size_t uncached = 0) {
  detail::access::state(cache).check_segments();
  const cache_stats st = cache.stats();
  REQUIRE(st.segment_bytes - st.segment_free_bytes >= st.arena_bytes);  // spans are segment bytes
  CHECK(st.segment_bytes - st.segment_free_bytes - st.arena_bytes <= st.held_bytes);
  CHECK(be.outstanding_bytes() == st.held_bytes + st.segment_free_bytes + uncached);
  CHECK(st.reserved_bytes == be.outstanding_bytes());  // PyTorch's "reserved": everything held from the backend
  CHECK(st.peak_reserved_bytes >= st.reserved_bytes);
  CHECK(st.reserved_allocated_bytes - st.reserved_freed_bytes == st.reserved_bytes);  // its totals in and out
  CHECK((st.segment_free_ranges == 0) == (st.segment_free_bytes == 0));  // PyTorch's inactive split blocks
}

}  // namespace

TEST_CASE("segments: an idle piece of exactly the key is a hit; other sizes are carved from the same segment",
          "[segments][cache]") {
  heap_fixture f;
  alloc_cache cache{with_segments()};
  scope s(cache);
  std::uintptr_t first = 0;
  {
    auto a = allocate(f.be, 1000);  // rounded to the 512 B piece unit: 1024
    first = at(a);
    CHECK(a.bytes() == 1000);
    CHECK(a.capacity() == 1024);
  }
  cache_stats st = cache.stats();
  CHECK(st.misses == 1);
  CHECK(st.segments == 1);
  CHECK(st.segment_grows == 1);
  CHECK(st.segment_bytes == 2 * MiB);  // one commit of the 2 MiB granule
  CHECK(st.segment_free_bytes == 2 * MiB - 1024);
  CHECK(st.idle_bytes == 1024);
  CHECK(st.backend_allocations == 0);  // pieces are no backend allocations: segment_grows counts the driver calls

  auto b = allocate(f.be, 1024);  // same key: the idle piece, no carve
  CHECK(at(b) == first);
  auto c = allocate(f.be, 3000);  // another key: carved right after b
  CHECK(at(c) == first + 1024);
  CHECK(c.capacity() == 3072);
  auto one = allocate(f.be, 1);
  CHECK(one.capacity() == 512);
  st = cache.stats();
  CHECK(st.hits == 1);
  CHECK(st.misses == 3);
  CHECK(st.segment_grows == 1);
  CHECK(f.tracker->commits() == 1);
  CHECK(f.tracker->allocations() == 0);
  CHECK(st.held_bytes == 1024 + 3072 + 512);
  check_books(cache, f.be);
}

TEST_CASE("segment policies: automatic means device memory with virtual memory; on means every backend",
          "[segments][cache][policy]") {
  // Segments made for one 100 B request, and the bytes the backend allocated for it.
  const auto segments_after_one = [](cache_options o, heap_fixture& f) {
    alloc_cache cache{o};
    scope s(cache);
    auto a = allocate(f.be, 100);
    const cache_stats st = cache.stats();
    CHECK(st.held_bytes == a.capacity());
    return std::pair{st.segments, f.tracker->allocated()};
  };
  SECTION("automatic: device memory with virtual memory gets segments") {
    heap_fixture f(1 << 30, memory_kind::device);
    CHECK(segments_after_one(with_segments(segment_policy::automatic), f) == std::pair{std::size_t{1}, std::size_t{0}});
    CHECK(f.tracker->commits() == 1);
  }
  SECTION("automatic: host memory, stream-ordered memory and backends without virtual memory do not") {
    const std::pair plain{std::size_t{0}, std::size_t{100}};
    heap_fixture host;
    CHECK(segments_after_one(cache_options{}, host) == plain);
    heap_fixture async(1 << 30, memory_kind::device_async);
    CHECK(segments_after_one(with_segments(segment_policy::automatic), async) == plain);
    heap_fixture no_vm(1 << 30, memory_kind::device, false);
    CHECK(segments_after_one(with_segments(segment_policy::automatic), no_vm) == plain);
  }
  SECTION("on without virtual memory: segments made of backend allocations") {
    heap_fixture f(1 << 30, {}, false);
    // One 2 MiB segment for small requests.
    CHECK(segments_after_one(with_segments(segment_policy::on), f) == std::pair{std::size_t{1}, 2 * MiB});
    CHECK(f.tracker->allocations() == 1);
  }
  SECTION("off: plain blocks even where automatic would carve") {
    heap_fixture f(1 << 30, memory_kind::device);
    CHECK(segments_after_one(with_segments(segment_policy::off), f) == std::pair{std::size_t{0}, std::size_t{100}});
  }
}

TEST_CASE("segments: a small miss no free range holds gives the pool's idle pieces back, and they coalesce",
          "[segments][cache]") {
  heap_fixture f(4 * MiB);  // a granule for each pool: nothing can grow
  alloc_cache cache{with_segments()};
  scope s(cache);
  { auto idle_large = allocate(f.be, 3 * MiB / 2); }  // the large pool's piece, idle: it stays out of this
  std::vector<data_ref> pieces;
  for (int i = 0; i < 32; ++i) pieces.push_back(allocate(f.be, 64 * KiB));
  const std::uintptr_t base = at(pieces[0]);
  for (std::size_t i = 0; i < pieces.size(); ++i) CHECK(at(pieces[i]) == base + i * 64 * KiB);
  CHECK(cache.stats().segment_free_bytes == 2 * MiB - 3 * MiB / 2);  // only the large segment's tail
  pieces[5].reset();
  pieces[5] = allocate(f.be, 64 * KiB);  // no free range, but an idle piece of the key: a hit
  CHECK(at(pieces[5]) == base + 5 * 64 * KiB);
  CHECK(cache.stats().hits == 1);
  for (auto& p : pieces) p.reset();
  auto big = allocate(f.be, 256 * KiB);  // small: at most 256 KiB
  CHECK(at(big) == base);  // the 32 pieces went back and joined into one free range
  const cache_stats st = cache.stats();
  CHECK(st.idle_blocks == 1);  // the large pool's idle piece: only the small pool's went back
  CHECK(st.segment_grows == 2);
  CHECK(st.hits == 1);
  CHECK(st.merges >= 31);
  CHECK(st.reclaimed_blocks == 0);  // making room is no reclaim
  CHECK(st.oom_retries == 0);
  CHECK(f.tracker->refusals() == 0);  // room came from idle pieces before any growth was tried
  check_books(cache, f.be);
}

TEST_CASE("segments: a large miss gives idle large pieces back first, so best fit sees all reusable memory",
          "[segments][cache]") {
  heap_fixture f;
  alloc_cache cache{with_segments()};
  scope s(cache);
  auto a = allocate(f.be, 8 * MiB);
  auto separator = allocate(f.be, 2 * MiB);
  auto g = allocate(f.be, 15 * MiB);   // in a commit of 16 MiB
  auto end = allocate(f.be, 2 * MiB);  // its first MiB in g's commit, so that commit is never free whole
  const std::uintptr_t at_a = at(a);
  CHECK(at(g) == at_a + 10 * MiB);
  g.reset();
  CHECK(cache.reclaim(8 * MiB) == 0);  // g's piece goes back: a free 15 MiB range, in the middle: nothing trimmed
  CHECK(cache.stats().segment_free_bytes == 16 * MiB);  // and 1 MiB after end
  a.reset();                                            // idle: 8 MiB at the start
  // A free range holds 7 MiB, but a's 8 MiB fit better: a goes back first, and best fit takes it.
  auto c = allocate(f.be, 7 * MiB);
  CHECK(at(c) == at_a);
  const cache_stats st = cache.stats();
  CHECK(st.idle_blocks == 0);
  CHECK(st.segment_free_bytes == 17 * MiB);
  check_books(cache, f.be);
}

TEST_CASE("segments: unsafe_free, reshape and escapes hold for pieces", "[segments][cache]") {
  heap_fixture f;
  alloc_cache cache{with_segments()};
  data_ref kept;
  std::uintptr_t escaped = 0;
  {
    scope s(cache);
    auto a = empty<float>(f.be, {256});
    const auto* first = a.data();
    a.unsafe_free();
    CHECK_THROWS_AS(a.data(), use_after_free);
    auto b = empty<float>(f.be, {16, 16});  // the same piece, reshaped
    CHECK(b.data() == first);
    auto c = b.reshape({256});
    CHECK(c.data() == first);
    auto d = empty<double>(f.be, {128});  // b is live: another piece of the same key
    CHECK(static_cast<const void*>(d.data()) != static_cast<const void*>(first));
    auto e = allocate(f.be, 5000);
    kept = e;  // escapes the scope
    escaped = at(e);
  }
  cache_stats st = cache.stats();
  CHECK(st.unsafe_frees == 1);
  CHECK(st.escapes == 1);
  CHECK(st.live_blocks == 1);
  std::memset(kept.data(), 7, 5000);
  {
    scope s(cache);
    auto again = allocate(f.be, 5000);  // the escaped piece is referenced: never handed out
    CHECK(at(again) != escaped);
    std::memset(again.data(), 1, 5000);
  }
  const auto* bytes = static_cast<const unsigned char*>(kept.data());
  CHECK(std::all_of(bytes, bytes + 5000, [](unsigned char v) { return v == 7; }));
  kept.reset();
  st = cache.stats();
  CHECK(st.live_blocks == 0);
  check_books(cache, f.be);
}

TEST_CASE("segments: a loop gets the same addresses every iteration and makes no driver call after the first",
          "[segments][cache][stable]") {
  heap_fixture f;
  alloc_cache cache{with_segments()};
  const std::size_t sizes[] = {1000, 70000, 3 * MiB, 512, 200000, 5 * MiB + 3, 1000, 64, 300 * KiB, 2 * MiB};
  std::vector<std::uintptr_t> first;
  std::size_t commits_after_first = 0;
  for (int it = 0; it < 6; ++it) {
    scope s(cache);
    std::vector<data_ref> live;
    std::vector<std::uintptr_t> got;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      live.push_back(allocate(f.be, sizes[i]));
      got.push_back(at(live.back()));
      if (i % 3 == 2) live[i - 1].reset();  // some die young, so later requests reuse them
    }
    if (it == 0) {
      first = got;
      commits_after_first = f.tracker->commits();
    } else {
      CHECK(got == first);
    }
  }
  CHECK(f.tracker->commits() == commits_after_first);
  CHECK(f.tracker->reservations() == 2);  // one growable segment per pool
  check_books(cache, f.be);
}

TEST_CASE("segments: a piece carved from bytes used on other streams waits for each of them",
          "[segments][cache][streams]") {
  heap_fixture f(2 * MiB);
  alloc_cache cache{with_segments()};
  scope s(cache);
  auto a = allocate(f.be, 512 * KiB, stream(1));
  auto b = allocate(f.be, 512 * KiB, stream(2));
  auto filler = allocate(f.be, MiB, stream(9));
  CHECK(cache.stats().segment_free_bytes == 0);
  a.reset();
  b.reset();
  f.tracker->clear_orders();
  auto c = allocate(f.be, MiB, stream(3));  // a and b go back, coalesce, and are carved for stream 3
  CHECK(at(c) == at(filler) - MiB);
  auto orders = f.tracker->orders();
  std::sort(orders.begin(), orders.end(), [](const auto& x, const auto& y) { return x.first.handle < y.first.handle; });
  REQUIRE(orders.size() == 2);
  CHECK(orders[0] == std::pair{stream(1), stream(3)});
  CHECK(orders[1] == std::pair{stream(2), stream(3)});
  CHECK(cache.stats().cross_stream_reuses == 1);

  // Same stream again: an exact-key hit, nothing to wait for.
  c.reset();
  f.tracker->clear_orders();
  auto d = allocate(f.be, MiB, stream(3));
  CHECK(at(d) == at(filler) - MiB);
  CHECK(f.tracker->orders().empty());

  // A hit on an idle piece of another stream waits for it, as any block does; and for streams
  // recorded on it.
  d.record_stream(stream(4));
  d.reset();
  f.tracker->clear_orders();
  auto e = allocate(f.be, MiB, stream(5));
  orders = f.tracker->orders();
  std::sort(orders.begin(), orders.end(), [](const auto& x, const auto& y) { return x.first.handle < y.first.handle; });
  REQUIRE(orders.size() == 2);
  CHECK(orders[0] == std::pair{stream(3), stream(5)});
  CHECK(orders[1] == std::pair{stream(4), stream(5)});
  CHECK(f.tracker->synchronizations() == 0);
}

TEST_CASE("segments: bytes used on more streams than a set holds make the next user wait for the device",
          "[segments][cache][streams]") {
  heap_fixture f(2 * MiB);
  alloc_cache cache{with_segments()};
  scope s(cache);
  const std::size_t piece = 16 * KiB;  // nine of them are still a small request (up to 256 KiB)
  // Nine 16 KiB pieces on nine streams, a live separator, one more piece, and a live filler.
  std::vector<data_ref> nine;
  for (std::uintptr_t i = 1; i <= 9; ++i) nine.push_back(allocate(f.be, piece, stream(i)));
  auto separator = allocate(f.be, piece, stream(100));
  auto tenth = allocate(f.be, piece, stream(10));
  std::vector<data_ref> fillers;  // the rest of the small pool's 2 MiB, in small pieces (up to 256 KiB)
  for (std::size_t left = 2 * MiB - 11 * piece; left > 0; left -= std::min(left, 256 * KiB))
    fillers.push_back(allocate(f.be, std::min(left, 256 * KiB), stream(100)));
  CHECK(cache.stats().segment_free_bytes == 0);
  tenth.reset();                   // released first: given back first, alone
  for (auto& p : nine) p.reset();  // then the nine, which coalesce
  f.tracker->clear_orders();
  auto wide = allocate(f.be, 9 * piece, stream(50));
  CHECK(f.tracker->synchronizations() == 1);  // nine streams: "any", so the whole device
  CHECK(f.tracker->orders().empty());
  // After the device-wide wait no free byte has work in flight: the tenth piece's range forgot
  // stream 10, so carving it for stream 51 needs no wait.
  auto after = allocate(f.be, piece, stream(51));
  CHECK(at(after) == at(separator) + piece);
  CHECK(f.tracker->orders().empty());
  CHECK(f.tracker->synchronizations() == 1);
}

TEST_CASE("segments: reclaim gives every segment back, and the cache keeps no backend alive",
          "[segments][cache][reclaim]") {
  alloc_cache cache{with_segments()};
  std::weak_ptr<test::tracking_resource> watched;
  {
    auto tracker = std::make_shared<test::tracking_resource>(make_host_resource());
    watched = tracker;
    const backend be(tracker);
    scope s(cache);
    for (std::size_t bytes = 1000; bytes < 8 * MiB; bytes = bytes * 3 + 17) (void)allocate(be, bytes);
    auto huge = allocate(be, 300 * MiB);  // a segment of its own
    (void)huge;
  }
  CHECK_FALSE(watched.expired());  // its idle pieces and their segments hold it
  const cache_stats before = cache.stats();
  CHECK(before.segments >= 2);
  CHECK(cache.reclaim(0) == before.segment_bytes);  // every committed byte went back
  CHECK(watched.expired());
  const cache_stats st = cache.stats();
  CHECK(st.segments == 0);
  CHECK(st.segment_bytes == 0);
  CHECK(st.held_bytes == 0);
  CHECK(st.idle_blocks == 0);
  CHECK(st.segment_grows == before.segment_grows);  // counters of dropped heaps are kept
  CHECK(st.splits == before.splits);
  // Every committed byte went back through trims, at least one driver call per segment.
  CHECK(st.segment_trimmed_bytes - before.segment_trimmed_bytes == before.segment_bytes);
  CHECK(st.segment_trims - before.segment_trims >= before.segments);
}

TEST_CASE("segments: segment_trims counts the driver calls of trims, with virtual memory and without",
          "[segments][cache][reclaim]") {
  const bool with_vm = GENERATE(true, false);
  CAPTURE(with_vm);
  auto tracker = std::make_shared<test::tracking_resource>(make_host_resource(), std::nullopt, with_vm);
  const backend be(tracker);
  alloc_cache cache{with_segments()};
  {
    scope s(cache);
    for (std::size_t bytes = 1000; bytes < 8 * MiB; bytes = bytes * 3 + 17) (void)allocate(be, bytes);
    auto large = allocate(be, 40 * MiB);
    (void)large;
  }
  const cache_stats before = cache.stats();
  REQUIRE(before.segments >= 2);
  const std::size_t calls_before = tracker->decommits() + tracker->deallocations();
  cache.reclaim(0);
  const cache_stats st = cache.stats();
  CHECK(st.segments == 0);
  CHECK(st.segment_trims - before.segment_trims == tracker->decommits() + tracker->deallocations() - calls_before);
  CHECK(st.segment_trims - before.segment_trims >= before.segments);
  CHECK(st.segment_trimmed_bytes - before.segment_trimmed_bytes == before.segment_bytes);
  CHECK(be.outstanding_bytes() == 0);
}

TEST_CASE("segments: reclaim keeps what it is asked to keep; live pieces keep their segment",
          "[segments][cache][reclaim]") {
  heap_fixture f;
  alloc_cache cache{with_segments()};
  scope s(cache);
  auto live = allocate(f.be, 4096);
  { auto idle = allocate(f.be, 8192); }
  // Nothing can go: 8 KiB idle are under 1 MiB, and the segment's only commit holds a live piece.
  CHECK(cache.reclaim(1 << 20) == 0);
  CHECK(cache.stats().idle_blocks == 1);
  cache.reclaim(0);
  cache_stats st = cache.stats();
  CHECK(st.idle_blocks == 0);
  CHECK(st.segments == 1);  // live's segment stays, whole: its only commit holds a piece
  CHECK(st.held_bytes == 4096);
  check_books(cache, f.be);
  live.reset();
  cache.reclaim(0);
  st = cache.stats();
  CHECK(st.segments == 0);
  CHECK(f.be.outstanding_bytes() == 0);
  CHECK(f.tracker->reservations() == 0);
}

TEST_CASE("segments: an idle limit evicts pieces and trims their segments", "[segments][cache][limits]") {
  heap_fixture f;
  alloc_cache cache{with_segments()};
  cache.set_max_idle_bytes(0);
  {
    scope s(cache);
    for (int i = 0; i < 10; ++i) {
      auto a = allocate(f.be, 100 * KiB);
      auto b = allocate(f.be, 3 * MiB);
    }
  }
  const cache_stats st = cache.stats();
  CHECK(st.idle_blocks == 0);
  CHECK(st.evictions >= 20);
  CHECK(st.segments == 0);
  CHECK(f.be.outstanding_bytes() == 0);
}

TEST_CASE("segments: out of memory gives idle pieces back, trims, retries once, then names the segments",
          "[segments][cache][oom]") {
  SECTION("room made by trimming another pool's free segment") {
    heap_fixture f(4 * MiB);
    alloc_cache cache{with_segments()};
    scope s(cache);
    { auto large = allocate(f.be, 3 * MiB); }  // the large pool commits 4 MiB: the whole budget
    auto small = allocate(f.be, 256 * KiB);    // the small pool needs 2 MiB: the large segment must go
    const cache_stats st = cache.stats();
    CHECK(st.oom_retries == 1);
    CHECK(st.ooms == 0);
    CHECK(st.segments == 1);
    CHECK(f.limited->used() == 2 * MiB);
    check_books(cache, f.be);
  }
  SECTION("no room at all: out_of_memory with the heap's state") {
    heap_fixture f(4 * MiB);
    alloc_cache cache{with_segments()};
    scope s(cache);
    auto live = allocate(f.be, 3 * MiB);  // 4 MiB committed, a free tail of 1 MiB
    try {
      (void)allocate(f.be, 2 * MiB);
      FAIL("no exception");
    } catch (const out_of_memory& e) {
      CHECK(e.requested_bytes() == 2 * MiB);
      CHECK_THAT(e.what(), Catch::Contains("its segments hold 4 MiB in 1 segments") &&
                               Catch::Contains("1 MiB of it free") && Catch::Contains("3 MiB live"));
    }
    cache_stats st = cache.stats();
    CHECK(st.ooms == 1);
    CHECK(st.oom_retries == 1);
    check_books(cache, f.be);
    live.reset();
    cache.reclaim(0);
    CHECK(f.limited->used() == 0);
  }
}

TEST_CASE("segments: uncached requests stay backend allocations of their exact size", "[segments][cache]") {
  heap_fixture f;
  alloc_cache cache{with_segments()};
  scope s(cache);
  {
    uncached_guard g;
    auto u = allocate(f.be, 1000);
    CHECK(f.tracker->allocations() == 1);
    CHECK(f.tracker->allocated() == 1000);
  }
  CHECK(f.tracker->allocated() == 0);
  CHECK(cache.stats().segments == 0);
}

TEST_CASE("segments: pieces live when the cache is destroyed stay valid and give their segment back last",
          "[segments][cache][destruction]") {
  heap_fixture f;
  data_ref survivor;
  data_ref large_survivor;
  {
    alloc_cache cache{with_segments()};
    {
      scope s(cache);
      survivor = allocate(f.be, 3000);
      large_survivor = allocate(f.be, 5 * MiB);  // commits 6 MiB
      auto idle = allocate(f.be, 5000);
      auto idle_large = allocate(f.be, 7 * MiB);  // grows the large segment by a 6 MiB commit
    }
  }
  // The commits holding the survivors stay; the large segment's last commit went.
  CHECK(f.be.outstanding_bytes() == 2 * MiB + 6 * MiB);
  std::memset(survivor.data(), 3, 3000);
  std::memset(large_survivor.data(), 4, 5 * MiB);
  survivor.reset();
  CHECK(f.be.outstanding_bytes() == 6 * MiB);
  large_survivor.reset();
  CHECK(f.be.outstanding_bytes() == 0);
  CHECK(f.tracker->reservations() == 0);
  CHECK(f.tracker->held() == 0);
}

TEST_CASE("segments: a planned scope falls back to pieces and replays its plan", "[segments][cache][plan]") {
  heap_fixture f;
  alloc_cache cache{with_segments()};
  for (int it = 0; it < 4; ++it) {
    scope s(cache, {.plan = "step"});
    auto a = allocate(f.be, 1000);
    auto b = allocate(f.be, 3 * MiB);
    a.reset();
    auto c = allocate(f.be, 500);
  }
  const cache_stats st = cache.stats();
  CHECK(st.plan_hits > 0);
  check_books(cache, f.be, st.arena_bytes);
}

// ---- faults -------------------------------------------------------------------------------

namespace {

enum class thrown { nothing, out_of_memory, backend_error, other };

// Two threads, each six iterations of a loop body with small and large pieces, a nested scope,
// an escape, an unsafe_free, a reshape, and (thread 0) a reclaim.
void fault_body(alloc_cache& cache, const backend& be, int tid, std::mutex& keep_mutex, std::vector<data_ref>& kept) {
  for (int it = 0; it < 6; ++it) {
    scope s(cache);
    auto a = empty<float>(be, {256});
    auto b = empty<double>(be, {static_cast<std::size_t>(64 + 32 * tid)});
    auto big = allocate(be, (1 + static_cast<std::size_t>(it % 3)) * MiB + 1000 * static_cast<std::size_t>(tid));
    {
      scope inner(cache);
      auto c = empty<std::uint8_t>(be, {1000});
      c.unsafe_free();
      auto d = empty<float>(be, {250});
      d.data()[0] = 1.0f;
    }
    a = {};
    auto e = empty<float>(be, {static_cast<std::size_t>(64 * (it + 1))});
    if (it == 1) {
      std::lock_guard guard(keep_mutex);
      kept.push_back(e.ref());
    }
    big = {};
    auto huge = allocate(be, 5 * MiB + static_cast<std::size_t>(it) * 300 * KiB);
    auto f2 = b.reshape({2, static_cast<std::size_t>(32 + 16 * tid)});
    if (tid == 0 && it == 2) cache.reclaim(512 * KiB);
  }
}

}  // namespace

TEST_CASE("segments: the Nth backend call (allocation, reservation or commit) fails, for every N",
          "[segments][cache][faults]") {
  for (const auto how : {failing_resource::failure::out_of_memory, failing_resource::failure::backend_error}) {
    for (const bool vm : {true, false}) {
      std::uint64_t calls_without_faults = 0;
      for (std::uint64_t n = 1;; ++n) {
        heap_fixture f(64 * MiB, {}, vm);
        f.failing->arm(n, how == failing_resource::failure::out_of_memory ? 2 : 1, how);
        thrown outcome[2] = {thrown::nothing, thrown::nothing};
        std::vector<data_ref> kept;
        std::mutex keep_mutex;
        {
          alloc_cache cache{with_segments()};
          std::vector<std::thread> threads;
          for (int tid = 0; tid < 2; ++tid) {
            threads.emplace_back([&, tid] {
              try {
                fault_body(cache, f.be, tid, keep_mutex, kept);
              } catch (const out_of_memory&) {
                outcome[tid] = thrown::out_of_memory;
              } catch (const backend_error&) {
                outcome[tid] = thrown::backend_error;
              } catch (...) {
                outcome[tid] = thrown::other;
              }
            });
          }
          for (auto& t : threads) t.join();
          const cache_stats st = cache.stats();
          INFO("fault at call " << n << (vm ? " (virtual memory)" : " (plain segments)"));
          CHECK(outcome[0] != thrown::other);
          CHECK(outcome[1] != thrown::other);
          CHECK(st.live_blocks == kept.size());
          check_books(cache, f.be);
          kept.clear();
          CHECK(cache.stats().live_blocks == 0);
          check_books(cache, f.be);
        }
        CHECK(f.be.outstanding_bytes() == 0);
        CHECK(f.tracker->held() == 0);
        CHECK(f.tracker->reservations() == 0);
        CHECK(f.limited->used() == 0);
        if (f.failing->injected() == 0) {  // past the last call: the run made no fault
          calls_without_faults = f.failing->calls();
          break;
        }
      }
      // Both pools grow: with virtual memory two reservations and their commits, and growth in
      // place; without, a small and a shared large segment.
      CHECK(calls_without_faults >= (vm ? 5u : 2u));
    }
  }
}

// ---- threads ------------------------------------------------------------------------------

TEST_CASE("segments under threads: stamped pieces never overlap, across hand-offs, reclaims and limits",
          "[segments][cache][threads]") {
  heap_fixture f(std::size_t{1} << 32);
  alloc_cache cache{with_segments()};
  constexpr int workers = 4;
  const int ops = std::getenv("REFPOOL_SEGMENT_STRESS_OPS") != nullptr
                      ? std::atoi(std::getenv("REFPOOL_SEGMENT_STRESS_OPS"))
                      : 4000;
  struct stamped {
    data_ref ref;
    std::uint64_t stamp = 0;
  };
  const auto write = [](stamped& s) {
    auto* words = static_cast<std::uint64_t*>(s.ref.data());
    const std::size_t n = s.ref.bytes() / 8;
    for (std::size_t i = 0; i < n; i += 61) words[i] = s.stamp + i;  // sparse: large pieces stay cheap
  };
  const auto intact = [](const stamped& s) {
    const auto* words = static_cast<const std::uint64_t*>(s.ref.data());
    const std::size_t n = s.ref.bytes() / 8;
    for (std::size_t i = 0; i < n; i += 61)
      if (words[i] != s.stamp + i) return false;
    return true;
  };
  std::mutex box_mutex;
  std::vector<stamped> box;  // pieces handed from one thread to another
  std::atomic<int> done{0};
  std::atomic<std::uint64_t> broken{0};
  std::vector<std::thread> threads;
  for (int tid = 0; tid < workers; ++tid) {
    threads.emplace_back([&, tid] {
      std::mt19937_64 rng(0xC0FFEEull + static_cast<std::uint64_t>(tid));
      std::uint64_t next = static_cast<std::uint64_t>(tid + 1) << 48;
      std::vector<stamped> mine;
      for (int op = 0; op < ops;) {
        scope s(cache);
        for (int k = 0; k < 16 && op < ops; ++k, ++op) {
          const unsigned what = rng() % 8;
          if (what < 4 || mine.empty()) {
            const std::size_t bytes = rng() % 4 == 0 ? (1 + rng() % (3 * MiB)) : 8 + rng() % (64 * KiB);
            stamped made{allocate(f.be, bytes, stream(1 + rng() % 3)), next++ << 20};
            write(made);
            mine.push_back(std::move(made));
          } else if (what < 6) {
            const std::size_t i = rng() % mine.size();
            if (!intact(mine[i])) broken.fetch_add(1);
            if (rng() % 4 == 0) mine[i].ref.unsafe_free();
            mine[i] = std::move(mine.back());
            mine.pop_back();
          } else if (what == 6) {
            std::lock_guard guard(box_mutex);
            if (!box.empty() && rng() % 2 == 0) {
              mine.push_back(std::move(box.back()));
              box.pop_back();
            } else {
              box.push_back(std::move(mine.back()));
              mine.pop_back();
            }
          } else {
            for (const stamped& m : mine)
              if (!intact(m)) broken.fetch_add(1);
          }
        }
        while (mine.size() > 24) mine.erase(mine.begin());  // older ones escape, then go
      }
      for (const stamped& m : mine)
        if (!intact(m)) broken.fetch_add(1);
      done.fetch_add(1);
    });
  }
  std::thread reclaimer([&] {
    std::mt19937_64 rng(7);
    while (done.load() < workers) {
      switch (rng() % 4) {
        case 0: cache.reclaim(rng() % (8 * MiB)); break;
        case 1: cache.set_max_idle_bytes(rng() % 2 == 0 ? cache_options::unlimited : rng() % (16 * MiB)); break;
        default: (void)cache.stats(); break;
      }
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  reclaimer.join();
  CHECK(broken.load() == 0);
  {
    std::lock_guard guard(box_mutex);
    for (const stamped& m : box) CHECK(intact(m));
    box.clear();
  }
  const cache_stats st = cache.stats();
  CHECK(st.live_blocks == 0);
  CHECK(st.splits > 0);
  CHECK(st.merges > 0);
  check_books(cache, f.be);
  cache.set_max_idle_bytes(cache_options::unlimited);
  cache.reclaim(0);
  CHECK(f.be.outstanding_bytes() == 0);
  CHECK(f.tracker->reservations() == 0);
}
