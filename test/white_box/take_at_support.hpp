// What the take-at tests share (take_at_test.cpp, take_at_hostile_test.cpp): a cache's options, a
// take by the internal call refpool_allocator_pool_take makes, the books checked after each step,
// and the counters a refused take must leave as they were.
#pragma once

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>

#include <refpool/refpool.hpp>

#include "access.hpp"
#include "api/take_at.hpp"
#include "cache/cache_state.hpp"

namespace refpool::test {

inline cache_options take_at_options(segment_policy segments) {
  cache_options o;
  o.segments = segments;
  return o;
}

inline data_ref take(alloc_cache& cache, const backend& be, void* address, std::size_t bytes, stream_ref stream = {}) {
  return detail::take_idle_at(cache, be, address, bytes, stream, "take");
}

/// The heaps hold exactly the cache's pieces, and the backend's bytes are the cache's (`spans`:
/// bytes of plan arenas carved by hand, which no counter of the cache's holds).
inline void check_books(const alloc_cache& cache, const backend& be, std::size_t spans = 0) {
  detail::access::state(cache).check_segments();
  const cache_stats st = cache.stats();
  CHECK(be.outstanding_bytes() == st.held_bytes + st.segment_free_bytes + spans);
}

/// The counters a refused take must leave as they were.
struct take_counts {
  std::size_t live_bytes, live_blocks, idle_bytes, idle_blocks, held_bytes, segment_free_bytes, segments;
  std::uint64_t hits, misses, steals;
  explicit take_counts(const cache_stats& s)
      : live_bytes(s.live_bytes),
        live_blocks(s.live_blocks),
        idle_bytes(s.idle_bytes),
        idle_blocks(s.idle_blocks),
        held_bytes(s.held_bytes),
        segment_free_bytes(s.segment_free_bytes),
        segments(s.segments),
        hits(s.hits),
        misses(s.misses),
        steals(s.steals) {}
  friend bool operator==(const take_counts&, const take_counts&) = default;
};

}  // namespace refpool::test
