// A cache's memory map (lib/cache/memory_map.hpp, issue 37): segments with their live, idle and
// free ranges, idle whole blocks where the cache has no segments, and a map taken while other
// threads allocate and release (run under TSan by CI's thread pass).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <thread>
#include <vector>

#include <refpool/refpool.hpp>

#include "access.hpp"
#include "cache/cache_state.hpp"

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
