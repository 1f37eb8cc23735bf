// Spans through a cache's segment source (lib/cache/segment_source_spans.cpp): what plan arenas
// are (docs/segments.md, "One memory space"). The cache's reserved bytes follow the heap's
// committed bytes, a span counts as arena bytes and never as held, the out-of-memory ladder yields
// idle spans, and a heap that keeps a yielded span's record is not dropped. Linked into
// segment_cache_test (test 'segment-cache').
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include <refpool/refpool.hpp>

#include "access.hpp"
#include "cache/cache_state.hpp"
#include "white_box/segment_fixture.hpp"

using namespace refpool;
using refpool::test::heap_fixture;
using refpool::test::KiB;
using refpool::test::MiB;

namespace {

cache_options segments_on(bool on) {
  cache_options o;
  o.segments = on ? segment_policy::on : segment_policy::off;
  return o;
}

/// Reserved bytes are the backend's outstanding bytes, arena bytes are the spans', and the cache's
/// blocks are what the segments hold besides their free bytes and spans.
void check_books(const alloc_cache& cache, const backend& be, std::size_t span_bytes) {
  detail::access::state(cache).check_segments();
  const cache_stats st = cache.stats();
  CHECK(st.arena_bytes == span_bytes);
  CHECK(st.reserved_bytes == be.outstanding_bytes());
  CHECK(st.reserved_bytes == st.held_bytes + st.segment_free_bytes + st.arena_bytes);
  CHECK(st.peak_reserved_bytes >= st.reserved_bytes);
  CHECK(st.reserved_allocated_bytes - st.reserved_freed_bytes == st.reserved_bytes);
}

void fill(const detail::segment_span& s, unsigned char value) { std::memset(s.address(), value, s.bytes); }

/// Holds yielded span `s` again after a reclaim gave its memory back, writes every byte of it,
/// checks the books and gives it back. Returns whether it moved.
bool hold_again_and_give_back(alloc_cache& cache, const backend& be, detail::segment_span* s) {
  detail::segment_source& spans = detail::access::state(cache).spans();
  detail::backend_state& state = *detail::access::state(be);
  const std::optional<bool> moved = spans.hold_span(state, *s, {});  // its record is still there
  REQUIRE(moved);
  fill(*s, 3);
  check_books(cache, be, s->bytes);
  spans.give_back_span(state, s, {});
  cache.reclaim(0);
  CHECK(be.outstanding_bytes() == 0);
  return *moved;
}

}  // namespace

TEST_CASE("segment source: a span is arena bytes, counted in reserved bytes and their peak, never held",
          "[segments][cache][spans]") {
  const bool segments = GENERATE(true, false);
  CAPTURE(segments);
  heap_fixture f;
  alloc_cache cache{segments_on(segments)};
  detail::cache_state& state = detail::access::state(cache);
  detail::backend_state& be = *detail::access::state(f.be);
  const std::uint64_t calls = f.be.allocation_count();
  const std::optional<detail::segment_span*> s = state.spans().carve_span(be, 3 * MiB + 100, {});
  REQUIRE(s);
  const std::size_t bytes = (*s)->bytes;  // the record goes with give_back_span
  CHECK(bytes == 3 * MiB + 512);          // rounded to the piece unit
  fill(**s, 1);
  cache_stats st = cache.stats();
  CHECK(st.held_bytes == 0);
  CHECK(st.reserved_bytes >= bytes);
  CHECK(st.peak_reserved_bytes == st.reserved_bytes);
  check_books(cache, f.be, bytes);
  if (!segments) {
    // A cache without segments: a heap of spans alone, the span one allocation of its size.
    CHECK(f.be.allocation_count() - calls == 1);
    CHECK(st.reserved_bytes == bytes);
    CHECK(st.segments == 1);
  }
  state.spans().idle_span(be, **s, {});
  check_books(cache, f.be, bytes);  // idle: still placed
  state.spans().give_back_span(be, *s, {});
  st = cache.stats();
  CHECK(st.arena_bytes == 0);
  CHECK(st.peak_reserved_bytes >= bytes);
  check_books(cache, f.be, 0);
  cache.reclaim(0);
  CHECK(f.be.outstanding_bytes() == 0);
  CHECK(cache.stats().reserved_bytes == 0);
}

TEST_CASE("segment source: out of memory yields idle spans, trims them, and the request is served",
          "[segments][cache][spans][oom]") {
  const bool segments = GENERATE(true, false);
  CAPTURE(segments);
  heap_fixture f(8 * MiB);
  alloc_cache cache{segments_on(segments)};
  detail::cache_state& state = detail::access::state(cache);
  detail::backend_state& be = *detail::access::state(f.be);
  const std::optional<detail::segment_span*> s = state.spans().carve_span(be, 6 * MiB, {});
  REQUIRE(s);
  fill(**s, 2);
  SECTION("a held span is kept: the request is out of memory") {
    scope sc(cache);
    CHECK_THROWS_AS(allocate(f.be, 5 * MiB), out_of_memory);
    CHECK(cache.stats().arena_bytes == 6 * MiB);
    state.spans().give_back_span(be, *s, {});
  }
  SECTION("an idle span yields and its segment goes") {
    state.spans().idle_span(be, **s, {});
    {
      scope sc(cache);
      auto big = allocate(f.be, 5 * MiB);
      const cache_stats st = cache.stats();
      CHECK(st.oom_retries == (segments ? 0u : 1u));  // a heap with pieces yields before it grows
      CHECK(st.ooms == 0);
      CHECK(st.arena_bytes == 0);
      check_books(cache, f.be, 0);
    }
    // Held again after the reclaim gave every (free) segment back: it moves.
    cache.reclaim(0);
    CHECK(f.be.outstanding_bytes() == 0);
    CHECK(hold_again_and_give_back(cache, f.be, *s));
  }
  cache.reclaim(0);
  CHECK(f.be.outstanding_bytes() == 0);
}

TEST_CASE("segment source: a heap whose only span yielded keeps it across a reclaim that drops empty heaps",
          "[segments][cache][spans]") {
  const bool segments = GENERATE(true, false);
  CAPTURE(segments);
  heap_fixture f;
  alloc_cache cache{segments_on(segments)};
  detail::cache_state& state = detail::access::state(cache);
  detail::backend_state& be = *detail::access::state(f.be);
  const std::optional<detail::segment_span*> s = state.spans().carve_span(be, 1 * MiB, {});
  REQUIRE(s);
  state.spans().idle_span(be, **s, {});
  CHECK(state.spans().yield_idle_spans(be) == 1 * MiB);
  cache.reclaim(0);  // trims every segment, then drops heaps with none
  cache_stats st = cache.stats();
  CHECK(st.segments == 0);
  CHECK(f.be.outstanding_bytes() == 0);
  CHECK(hold_again_and_give_back(cache, f.be, *s));  // no segment under it: it moves
}

TEST_CASE("segment source: a span held again at home keeps its address; extend grows it in place",
          "[segments][cache][spans]") {
  heap_fixture f;
  alloc_cache cache{segments_on(true)};
  detail::cache_state& state = detail::access::state(cache);
  detail::backend_state& be = *detail::access::state(f.be);
  scope sc(cache);
  auto live = allocate(f.be, 2 * MiB);  // keeps the segment when the span's commit is trimmed
  const std::optional<detail::segment_span*> s = state.spans().carve_span(be, 2 * MiB, {});
  REQUIRE(s);
  void* home = (*s)->address();
  state.spans().idle_span(be, **s, {});
  CHECK(state.spans().yield_idle_spans(be) == 2 * MiB);
  cache.reclaim(0);  // decommits the yielded bytes: a hole at its home
  CHECK(cache.stats().segment_bytes == 2 * MiB);
  const std::optional<bool> moved = state.spans().hold_span(be, **s, {});
  REQUIRE(moved);
  CHECK_FALSE(*moved);
  CHECK((*s)->address() == home);
  CHECK(state.spans().extend_span(be, **s, 3 * MiB, {}));
  CHECK((*s)->address() == home);
  CHECK((*s)->bytes == 3 * MiB);
  fill(**s, 5);
  check_books(cache, f.be, 3 * MiB);
  state.spans().give_back_span(be, *s, {});
}

TEST_CASE("segment source: a span that must grow gives the heap's free bytes back first, not held beside it",
          "[segments][cache][spans]") {
  heap_fixture f;
  alloc_cache cache{segments_on(true)};
  detail::cache_state& state = detail::access::state(cache);
  detail::backend_state& be = *detail::access::state(f.be);
  data_ref pin;
  {
    scope sc(cache);
    const data_ref freed = allocate(f.be, 6 * MiB);
    pin = allocate(f.be, 2 * MiB);  // escapes: keeps the freed bytes from the segment's tail
  }
  state.return_idle(be);  // the 6 MiB: free bytes of the heap, still committed
  const cache_stats before = cache.stats();
  REQUIRE(before.segment_free_bytes == 6 * MiB);
  // 8 MiB fits no free range: the 6 free MiB go back before the span commits its own.
  const std::optional<detail::segment_span*> s = state.spans().carve_span(be, 8 * MiB, {});
  REQUIRE(s);
  const cache_stats st = cache.stats();
  CHECK(st.segment_free_bytes == 0);
  CHECK(st.reserved_bytes == before.reserved_bytes - 6 * MiB + 8 * MiB);
  CHECK(st.peak_reserved_bytes == std::max(before.peak_reserved_bytes, st.reserved_bytes));
  check_books(cache, f.be, 8 * MiB);
  // Yielded, its home taken by a live piece: held again elsewhere, the free bytes trimmed first.
  state.spans().idle_span(be, **s, {});
  data_ref over;
  {
    scope sc(cache);
    over = allocate(f.be, 8 * MiB);  // the span's bytes, yielded
  }
  CHECK((*s)->now == detail::segment_span::state::yielded);
  const std::optional<bool> moved = state.spans().hold_span(be, **s, {});
  REQUIRE(moved);
  CHECK(*moved);
  CHECK(cache.stats().segment_free_bytes == 0);
  fill(**s, 4);
  check_books(cache, f.be, 8 * MiB);
  state.spans().give_back_span(be, *s, {});
  over = {};
  pin = {};
  cache.reclaim(0);
  CHECK(f.be.outstanding_bytes() == 0);
}
