// A cache's memory map (lib/cache/memory_map.hpp, issue 37): segments with their live, idle and
// free ranges, idle whole blocks where the cache has no segments, and a map taken while other
// threads allocate and release (run under TSan by CI's thread pass).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <refpool/refpool.hpp>

#include "access.hpp"
#include "cache/cache_state.hpp"
#include "support/fault_injection.hpp"

using namespace refpool;
using detail::map_pool;
using detail::range_state;

namespace {

constexpr std::size_t KiB = 1024;

cache_options with_segments(segment_policy p) {
  cache_options o;
  o.segments = p;
  return o;
}

detail::memory_map map_of(const alloc_cache& cache) { return detail::access::state(cache).map_memory(); }

std::uintptr_t at(const data_ref& r) { return reinterpret_cast<std::uintptr_t>(r.data()); }

/// Every segment's ranges lie in it, in address order, apart, and add up to its committed bytes;
/// segments are sorted by device, then address. Returns the bytes in `state` over the map.
std::size_t check_tiling(const detail::memory_map& map, range_state state) {
  std::size_t in_state = 0;
  for (std::size_t i = 0; i < map.size(); ++i) {
    const detail::map_segment& seg = map[i];
    if (i > 0) REQUIRE(std::pair(map[i - 1].device, map[i - 1].address) < std::pair(seg.device, seg.address));
    std::size_t sum = 0;
    std::uintptr_t end = seg.address;
    for (const detail::layout_range& r : seg.ranges) {
      REQUIRE(r.bytes > 0);
      REQUIRE(r.address >= end);
      REQUIRE(r.address + r.bytes <= seg.address + seg.reserved);
      end = r.address + r.bytes;
      sum += r.bytes;
      if (r.state == state) in_state += r.bytes;
    }
    REQUIRE(sum == seg.committed);
  }
  return in_state;
}

/// The range that starts at `address`, or null.
const detail::layout_range* range_at(const detail::memory_map& map, std::uintptr_t address) {
  for (const auto& seg : map)
    for (const auto& r : seg.ranges)
      if (r.address == address) return &r;
  return nullptr;
}

}  // namespace

TEST_CASE("memory map: segments show their live, idle and free ranges; reclaim takes the idle and free ones",
          "[memory-map]") {
  const backend be = make_host_backend();
  alloc_cache cache(with_segments(segment_policy::on));
  REQUIRE(map_of(cache).empty());
  std::vector<data_ref> live;
  for (std::size_t bytes : {3 * KiB, 10 * KiB, 100 * KiB, 2048 * KiB}) live.push_back(cache.allocate(be, bytes));
  detail::memory_map map = map_of(cache);
  REQUIRE(!map.empty());
  CHECK(check_tiling(map, range_state::idle) == 0);
  CHECK(check_tiling(map, range_state::live) == cache.stats().live_bytes);
  for (const data_ref& r : live) {
    const detail::layout_range* found = range_at(map, at(r));
    REQUIRE(found != nullptr);
    CHECK(found->state == range_state::live);
    CHECK(found->bytes >= r.bytes());
  }
  CHECK(std::any_of(map.begin(), map.end(), [](const auto& s) { return s.pool == map_pool::small; }));
  CHECK(std::any_of(map.begin(), map.end(), [](const auto& s) { return s.pool == map_pool::large; }));
  for (const auto& seg : map) CHECK(seg.kind == memory_kind::host);

  const std::uintptr_t released = at(live[1]);
  live.erase(live.begin() + 1);
  map = map_of(cache);
  REQUIRE(range_at(map, released) != nullptr);
  CHECK(range_at(map, released)->state == range_state::idle);
  CHECK(check_tiling(map, range_state::idle) == cache.stats().idle_bytes);
  CHECK(check_tiling(map, range_state::free) == cache.stats().segment_free_bytes);

  // Reclaim: the idle pieces go, and every segment no live piece keeps; what stays free lies in a
  // commit that a live piece shares (a commit goes back whole).
  const std::uintptr_t large = at(live.back());
  live.pop_back();
  map = map_of(cache);
  const std::size_t cached_before = check_tiling(map, range_state::free) + check_tiling(map, range_state::idle);
  cache.reclaim(0);
  map = map_of(cache);
  CHECK(check_tiling(map, range_state::idle) == 0);
  CHECK(range_at(map, large) == nullptr);
  CHECK(check_tiling(map, range_state::free) < cached_before);  // the large segment went back
  CHECK(check_tiling(map, range_state::free) == cache.stats().segment_free_bytes);
  for (const auto& seg : map)
    CHECK(
        std::any_of(seg.ranges.begin(), seg.ranges.end(), [](const auto& r) { return r.state == range_state::live; }));
  for (const data_ref& r : live) CHECK(range_at(map, at(r))->state == range_state::live);

  live.clear();
  cache.reclaim(0);
  CHECK(map_of(cache).empty());
}

TEST_CASE("memory map: without segments, idle whole blocks are segments of their own; live ones are not listed",
          "[memory-map]") {
  const backend be = make_host_backend();
  alloc_cache cache(with_segments(segment_policy::off));
  data_ref kept = cache.allocate(be, 5000);
  std::uintptr_t idle_at = 0;
  {
    data_ref released = cache.allocate(be, 70000);
    idle_at = at(released);
  }
  const detail::memory_map map = map_of(cache);
  REQUIRE(map.size() == 1);
  CHECK(map[0].pool == map_pool::whole_block);
  CHECK(map[0].address == idle_at);
  REQUIRE(map[0].ranges.size() == 1);
  CHECK(map[0].ranges[0].state == range_state::idle);
  CHECK(map[0].ranges[0].bytes == cache.stats().idle_bytes);
  CHECK(map[0].committed == map[0].ranges[0].bytes);
  CHECK(range_at(map, at(kept)) == nullptr);
  cache.reclaim(0);
  CHECK(map_of(cache).empty());
}

TEST_CASE("memory map: a plan's arena is a span, held or idle, in segments on and off", "[memory-map][spans]") {
  const bool segments = GENERATE(true, false);
  CAPTURE(segments);
  const backend be = make_host_backend();
  alloc_cache cache(with_segments(segments ? segment_policy::on : segment_policy::off));
  detail::segment_source& spans = detail::access::state(cache).spans();
  detail::backend_state& state = *detail::access::state(be);
  const std::optional<detail::segment_span*> s = spans.carve_span(state, 3 * 1024 * KiB, {});
  REQUIRE(s);
  const auto address = reinterpret_cast<std::uintptr_t>((*s)->address());
  detail::memory_map map = map_of(cache);
  REQUIRE(range_at(map, address) != nullptr);
  CHECK(range_at(map, address)->state == range_state::span_held);
  CHECK(check_tiling(map, range_state::span_held) == (*s)->bytes);
  spans.idle_span(state, **s, {});
  map = map_of(cache);
  CHECK(range_at(map, address)->state == range_state::span_idle);
  CHECK(check_tiling(map, range_state::span_idle) == (*s)->bytes);
  spans.give_back_span(state, *s, {});
  CHECK(check_tiling(map_of(cache), range_state::span_idle) == 0);
  cache.reclaim(0);
  CHECK(map_of(cache).empty());
}

TEST_CASE("memory map: taken while other threads allocate and release, every segment is consistent",
          "[memory-map][threads]") {
  const backend be = make_host_backend();
  auto policy = GENERATE(segment_policy::on, segment_policy::off);
  alloc_cache cache(with_segments(policy));
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> done{0};  // requests made so far, by every worker
  std::vector<std::thread> workers;
  for (int t = 0; t < 3; ++t) {
    workers.emplace_back([&, t] {
      std::vector<data_ref> held;
      for (std::size_t i = 0; !stop.load(std::memory_order_relaxed) && i < 200000; ++i) {
        const std::size_t bytes = 512 + ((i * 7919 + static_cast<std::size_t>(t) * 104729) % 64) * 4 * KiB;
        held.push_back(cache.allocate(be, bytes));
        done.fetch_add(1, std::memory_order_relaxed);
        if (held.size() > 8) held.erase(held.begin() + static_cast<std::ptrdiff_t>(i % held.size()));
        if (i % 1000 == 999) cache.reclaim(0);
      }
    });
  }
  // Maps while the workers run: at least 200, and until they made 30,000 requests between them.
  std::size_t rounds = 0;
  for (; rounds < 200 || done.load() < 30000; ++rounds) (void)check_tiling(map_of(cache), range_state::live);
  CHECK(done.load() < 3 * 200000);  // the maps were taken while they ran
  stop = true;
  for (auto& w : workers) w.join();
  // Quiet now: the map agrees with the counters exactly.
  const detail::memory_map map = map_of(cache);
  const cache_stats st = cache.stats();
  CHECK(check_tiling(map, range_state::idle) == st.idle_bytes);
  CHECK(check_tiling(map, range_state::live) == 0);
  cache.reclaim(0);
  CHECK(map_of(cache).empty());
}

namespace {

/// The quiet cache's map agrees with its counters exactly: live, idle and free bytes, segments,
/// their committed bytes and free ranges (each span is in no counter here: the test gives it back).
void check_against_stats(const alloc_cache& cache) {
  const detail::memory_map map = map_of(cache);
  const cache_stats st = cache.stats();
  CHECK(check_tiling(map, range_state::live) == st.live_bytes);
  CHECK(check_tiling(map, range_state::idle) == st.idle_bytes);
  CHECK(check_tiling(map, range_state::free) == st.segment_free_bytes);
  std::size_t segments = 0, committed = 0, free_ranges = 0;
  for (const auto& seg : map) {
    if (seg.pool == map_pool::whole_block) continue;
    ++segments;
    committed += seg.committed;
    free_ranges += static_cast<std::size_t>(std::count_if(seg.ranges.begin(), seg.ranges.end(),
                                                          [](const auto& r) { return r.state == range_state::free; }));
  }
  CHECK(segments == st.segments);
  CHECK(committed == st.segment_bytes);
  CHECK(free_ranges == st.segment_free_ranges);
}

}  // namespace

// A reclaim takes idle pieces out of the slots under the cache's mutex, then gives them back to
// their heap after leaving it: a map taken in between must not call them live (no buffer is).
TEST_CASE("memory map: pieces a reclaim is giving back never show as live", "[memory-map][threads]") {
  const backend be = make_host_backend();
  alloc_cache cache(with_segments(segment_policy::on));
  std::size_t live_seen = 0;
  std::size_t maps = 0;
  for (int round = 0; round < 40; ++round) {
    {
      std::vector<data_ref> made;
      for (std::size_t i = 0; i < 3000; ++i) made.push_back(cache.allocate(be, 4 * KiB + (i % 5) * 512));
    }  // every piece idle now: no buffer is live
    REQUIRE(cache.stats().live_bytes == 0);
    std::atomic<bool> reclaimed{false};
    std::thread reclaimer([&] {
      cache.reclaim(0);
      reclaimed = true;
    });
    while (!reclaimed.load()) {
      live_seen += check_tiling(map_of(cache), range_state::live);
      ++maps;
    }
    reclaimer.join();
  }
  INFO(maps << " maps taken during reclaims");
  CHECK(live_seen == 0);
}

// Every path that moves memory at once: misses that carve and give idle pieces back (large
// requests), hits, releases, reclaims, trims to an idle limit, arenas carved, idled, yielded, held
// again and given back; maps meanwhile. Under TSan this also checks the lock order (mutex_, slots,
// heaps) of the map against a miss's give_back_idle_pieces and the out-of-memory ladder.
TEST_CASE("memory map: taken while threads carve, trim, reclaim and move arenas, no deadlock; exact when quiet",
          "[memory-map][threads][spans]") {
  const backend be = make_host_backend();
  const auto policy = GENERATE(segment_policy::on, segment_policy::off);
  alloc_cache cache(with_segments(policy));
  detail::segment_source& spans = detail::access::state(cache).spans();
  detail::backend_state& state = *detail::access::state(be);
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> done{0};
  const auto pieces = [&](std::size_t t) {
    std::vector<data_ref> held;
    for (std::size_t i = 0; !stop.load(std::memory_order_relaxed) && i < 100000; ++i) {
      const std::size_t small = 512 + (i * 7919 % 300) * 512;
      const std::size_t large = (1 + i * 104729 % 9) * 1024 * KiB + 4096;  // a miss gives idle pieces back
      held.push_back(cache.allocate(be, t == 0 ? large : small));
      if (held.size() > 6) held.erase(held.begin() + static_cast<std::ptrdiff_t>(i % held.size()));
      if (t == 1 && i % 500 == 250) cache.set_max_idle_bytes(i % 1000 == 250 ? 256 * KiB : cache_options::unlimited);
      if (i % 700 == 699) cache.reclaim(t == 0 ? 0 : 1024 * KiB);
      done.fetch_add(1, std::memory_order_relaxed);
    }
  };
  const auto arenas = [&] {
    for (std::size_t i = 0; !stop.load(std::memory_order_relaxed) && i < 100000; ++i) {
      const std::optional<detail::segment_span*> s = spans.carve_span(state, (1 + i % 4) * 1024 * KiB + 8192, {});
      if (!s) continue;
      spans.idle_span(state, **s, {});
      if (i % 3 == 0) (void)spans.yield_idle_spans(state);
      if (spans.hold_span(state, **s, {})) std::memset((*s)->address(), 1, (*s)->bytes);
      spans.give_back_span(state, *s, {});
      done.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> workers;
  workers.emplace_back(pieces, 0);
  workers.emplace_back(pieces, 1);
  workers.emplace_back(arenas);
  for (std::size_t rounds = 0; rounds < 300 || done.load() < 20000; ++rounds) {
    const detail::memory_map map = map_of(cache);
    (void)check_tiling(map, range_state::live);
  }
  stop = true;
  for (auto& w : workers) w.join();
  cache.set_max_idle_bytes(cache_options::unlimited);
  check_against_stats(cache);
  CHECK(check_tiling(map_of(cache), range_state::span_held) == 0);
  cache.reclaim(0);
  check_against_stats(cache);
  CHECK(map_of(cache).empty());
}

// Growth that fails (a reservation, commit or allocation refused, out of memory or a driver error)
// while maps are taken: a failed carve leaves no range behind, and the map stays exact.
TEST_CASE("memory map: segments growing and failing to grow while maps are taken", "[memory-map][faults]") {
  const auto policy = GENERATE(segment_policy::on, segment_policy::off);
  auto failing = std::make_shared<failing_resource>(make_host_resource());
  const backend be(failing);
  alloc_cache cache(with_segments(policy));
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> failures{0};
  std::thread worker([&] {
    std::vector<data_ref> held;
    for (std::size_t i = 0; i < 3000; ++i) {
      if (i % 50 == 0)
        failing->arm(
            1 + i % 3, 1 + i % 2,
            i % 100 == 0 ? failing_resource::failure::backend_error : failing_resource::failure::out_of_memory);
      try {
        held.push_back(cache.allocate(be, (1 + i * 7919 % 40) * 64 * KiB));
      } catch (const out_of_memory&) {
        ++failures;
      } catch (const backend_error&) {
        ++failures;
      }
      if (held.size() > 5) held.erase(held.begin());
      if (i % 300 == 299) cache.reclaim(0);
    }
    failing->disarm();
    stop = true;
  });
  while (!stop.load()) (void)check_tiling(map_of(cache), range_state::live);
  worker.join();
  CHECK(failures.load() > 0);
  check_against_stats(cache);
  cache.reclaim(0);
  CHECK(map_of(cache).empty());
  CHECK(be.outstanding_bytes() == 0);
}

// A buffer outlives its cache: the closed cache's state lives on with it, and so does its map (the
// C API cannot reach a closed cache: a handle keeps its cache open).
TEST_CASE("memory map: a closed cache's map lists the pieces buffers still hold, then nothing",
          "[memory-map][lifetimes]") {
  const backend be = make_host_backend();
  data_ref kept;
  detail::cache_state* state = nullptr;
  std::uintptr_t kept_at = 0;
  {
    alloc_cache cache(with_segments(segment_policy::on));
    kept = cache.allocate(be, 20 * KiB);
    kept_at = at(kept);
    { data_ref idle = cache.allocate(be, 40 * KiB); }
    state = &detail::access::state(cache);
    state->retain();
  }
  REQUIRE(state->closed());
  detail::memory_map map = state->map_memory();
  REQUIRE(map.size() == 1);
  CHECK(range_at(map, kept_at) != nullptr);
  CHECK(range_at(map, kept_at)->state == range_state::live);
  CHECK(check_tiling(map, range_state::idle) == 0);  // closing freed the idle piece
  kept = {};
  CHECK(state->map_memory().empty());  // the last piece took the closed heap's segments with it
  state->release();
  CHECK(be.outstanding_bytes() == 0);
}

// Planned steps (the public API: arenas carved, held for a run, idled between runs, replaced when
// a run outgrows its plan) on one thread, plain requests and reclaims (which may yield idle arenas)
// on another, maps meanwhile: arenas show as spans, every segment stays consistent.
TEST_CASE("memory map: taken while planned steps hold, idle and replace their arenas", "[memory-map][threads][plan]") {
  const backend be = make_host_backend();
  const auto policy = GENERATE(segment_policy::on, segment_policy::off);
  alloc_cache cache(with_segments(policy));
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> spans_seen{0};
  std::atomic<std::size_t> maps_taken{0};
  std::thread stepper([&] {
    std::size_t replays_waited = 0;
    for (std::size_t s = 0; s < 400; ++s) {
      step st(cache, {.plan = "train"});
      const std::uint64_t hits_before = cache.stats().plan_hits;
      const std::size_t grow = s / 100;  // a longer run every 100 steps: a new plan, a larger arena
      std::vector<data_ref> held;
      for (std::size_t i = 0; i < 6 + grow; ++i) held.push_back(cache.allocate(be, (i + 1) * 48 * KiB));
      std::memset(held.back().data(), 7, held.back().bytes());
      // The first three replays holding their arena wait for two maps: on a busy machine the run
      // could end before any map is taken. Which step replays first depends on the plain thread
      // (its requests belong to the step too, so early runs may diverge), hence the hit count.
      if (replays_waited < 3 && cache.stats().plan_hits > hits_before) {
        ++replays_waited;
        const std::size_t from = maps_taken.load();
        for (int waited = 0; maps_taken.load() < from + 2 && waited < 2000; ++waited)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      held.clear();
      st.end();
    }
    stop = true;
  });
  std::thread plain([&] {
    for (std::size_t i = 0; !stop.load(); ++i) {
      data_ref r = cache.allocate(be, (1 + i % 13) * 40 * KiB);
      if (i % 50 == 49) cache.reclaim(0);
    }
  });
  while (!stop.load()) {
    const detail::memory_map map = map_of(cache);
    if (check_tiling(map, range_state::span_held) + check_tiling(map, range_state::span_idle) > 0) ++spans_seen;
    ++maps_taken;
  }
  stepper.join();
  plain.join();
  CHECK(spans_seen.load() > 0);
  CHECK(cache.stats().plan_hits > 0);
  const detail::memory_map map = map_of(cache);
  CHECK(check_tiling(map, range_state::span_held) == 0);  // no run holds its arena now
  CHECK(check_tiling(map, range_state::live) == 0);
  CHECK(check_tiling(map, range_state::idle) == cache.stats().idle_bytes);
  CHECK(check_tiling(map, range_state::free) == cache.stats().segment_free_bytes);
}
