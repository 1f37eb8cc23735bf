// Spans of the segment heap (lib/segments/span.hpp, segment_spans.cpp): ranges an owner (a plan
// arena) holds for a long time. Pinned while held; yielded to the free ranges when idle and their
// pool would grow (no backend call); held again at their home address, committing what trim
// decommitted there, or elsewhere when a piece took the bytes; grown in place; and every failure
// leaves the heap as it was. docs/segments.md, "One memory space", states the rules.
#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <refpool/error.hpp>

#include "support/fault_injection.hpp"
#include "white_box/segment_fixture.hpp"

using namespace refpool;
using detail::segment_heap;
using detail::segment_span;
using detail::stream_set;
using refpool::test::addr;
using refpool::test::heap_fixture;
using refpool::test::KiB;
using refpool::test::MiB;
using refpool::test::plain_options;
using refpool::test::span_options;
using refpool::test::stamp;
using refpool::test::stamped;
using refpool::test::stream;
using state = segment_span::state;

namespace {

segment_heap::piece must_carve(segment_heap& heap, std::size_t bytes, stream_ref s = {}) {
  auto c = heap.carve(bytes, s);
  REQUIRE(c.has_value());
  return c->p;
}

segment_span& must_carve_span(segment_heap& heap, std::size_t bytes, stream_ref s = {}) {
  auto c = heap.carve_span(bytes, s);
  REQUIRE(c.has_value());
  return *c->span;
}

/// The span's bytes, as the stamp helpers see a piece.
segment_heap::piece bytes_of(const segment_span& s) { return {s.address(), s.bytes, 0, s.node}; }

bool overlaps(const segment_heap::piece& p, const segment_span& s) {
  return addr(p) < s.home + s.bytes && s.home < addr(p) + p.bytes;
}

bool has(const stream_set& set, stream_ref s) {
  for (stream_ref x : set)
    if (x == s) return true;
  return false;
}

}  // namespace

TEST_CASE("a held span is pinned: best fit never carves it, trim never decommits it", "[segments][spans]") {
  const bool vm = GENERATE(false, true);
  heap_fixture f;
  segment_heap heap(f.be, vm ? span_options() : plain_options());
  segment_span& s = must_carve_span(heap, 8 * MiB + 100);
  CHECK(s.now == state::held);
  CHECK(s.bytes == 8 * MiB + 512);
  stamp(bytes_of(s), 0x5);
  std::vector<segment_heap::piece> pieces;
  for (std::size_t i = 0; i < 20; ++i) {
    pieces.push_back(must_carve(heap, (1 + i % 5) * MiB + i * KiB));
    CHECK_FALSE(overlaps(pieces.back(), s));
  }
  for (const auto& p : pieces) heap.give_back(p, {});
  heap.trim(0);
  heap.check();
  CHECK(stamped(bytes_of(s), 0x5));
  auto st = heap.stats();
  CHECK(st.span_bytes == s.bytes);
  CHECK(st.spans == 1);
  CHECK(st.used_bytes == 0);
  CHECK(st.pieces_out == 0);
  CHECK(st.committed_bytes == st.used_bytes + st.span_bytes + st.free_bytes);
  CHECK(st.committed_bytes >= s.bytes);
  CHECK_THROWS_WITH(heap.free_all(), Catch::Contains("1 spans") && Catch::Contains("still out"));
  heap.give_back_span(&s, {});
  CHECK(heap.stats().spans == 0);
  heap.trim(0);
  heap.check();
  CHECK(f.tracker->held() == 0);
  CHECK(f.be.outstanding_bytes() == 0);
}

TEST_CASE("an idle span yields its bytes when its pool would grow: no backend call, no held span touched",
          "[segments][spans]") {
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  segment_span& held = must_carve_span(heap, 4 * MiB);
  segment_span& idle = must_carve_span(heap, 8 * MiB);
  const auto after = must_carve(heap, 2 * MiB);  // keeps the idle span's bytes apart from the tail
  const std::uintptr_t home = idle.home;
  heap.idle_span(idle, stream_set(stream(5)));
  CHECK(heap.stats().idle_span_bytes == 8 * MiB);
  const std::size_t commits = f.tracker->commits();
  // 6 MiB fits no free range: the idle span's bytes serve it, where they are.
  auto p = heap.carve(6 * MiB, stream(7));
  REQUIRE(p.has_value());
  CHECK(addr(p->p) == home);
  CHECK(has(p->waits, stream(5)));  // the idle span's last users
  CHECK(f.tracker->commits() == commits);
  CHECK(idle.now == state::yielded);
  CHECK(held.now == state::held);
  auto st = heap.stats();
  CHECK(st.events.span_yields == 1);
  CHECK(st.span_bytes == 4 * MiB);
  CHECK(st.spans == 2);
  heap.check();
  // Held again while the piece is there: somewhere else (its owner rebases), the piece untouched.
  stamp(p->p, 0x7);
  const auto h = heap.hold_span(idle, {});
  REQUIRE(h.has_value());
  CHECK(h->moved);
  CHECK(idle.home != home);
  CHECK_FALSE(overlaps(p->p, idle));
  CHECK(stamped(p->p, 0x7));
  CHECK(heap.stats().events.span_moves == 1);
  heap.check();
  // A held span never yields: this growth commits.
  const auto big = must_carve(heap, 16 * MiB);
  CHECK(f.tracker->commits() > commits);
  CHECK(idle.now == state::held);
  for (const auto& piece : {after, p->p, big}) heap.give_back(piece, {});
  heap.give_back_span(&held, {});
  heap.give_back_span(&idle, {});
  heap.free_all();
  CHECK(f.be.outstanding_bytes() == 0);
}

TEST_CASE("idle spans yield least recently idle first, and only to growth of their own pool", "[segments][spans]") {
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  segment_span& small = must_carve_span(heap, 512 * KiB);  // the small pool
  segment_span& older = must_carve_span(heap, 6 * MiB);
  segment_span& newer = must_carve_span(heap, 6 * MiB);
  const auto pin = must_carve(heap, 2 * MiB);
  heap.idle_span(small, {});
  heap.idle_span(older, {});
  heap.idle_span(newer, {});
  const auto p = must_carve(heap, 5 * MiB);  // one large span's bytes are enough
  CHECK(older.now == state::yielded);
  CHECK(newer.now == state::idle);
  CHECK(small.now == state::idle);
  CHECK(heap.stats().events.span_yields == 1);
  // The out-of-memory step yields every idle span.
  CHECK(heap.yield_idle_spans() == newer.bytes + small.bytes);
  CHECK(newer.now == state::yielded);
  CHECK(small.now == state::yielded);
  heap.check();
  heap.give_back(p, {});
  heap.give_back(pin, {});
  for (segment_span* s : {&small, &older, &newer}) heap.give_back_span(s, {});
  heap.free_all();
}

TEST_CASE("a yielded span is held again at home, committing what trim decommitted there", "[segments][spans]") {
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  const auto before = must_carve(heap, 2 * MiB);
  const auto x = must_carve(heap, 6 * MiB);  // two commits, given back: the span lies over both
  const auto y = must_carve(heap, 6 * MiB);
  const auto after = must_carve(heap, 2 * MiB);
  REQUIRE(f.tracker->committed() == 16 * MiB);
  heap.give_back(x, {});
  heap.give_back(y, {});
  segment_span& s = must_carve_span(heap, 12 * MiB);
  const std::uintptr_t home = s.home;
  CHECK(home == addr(x));
  heap.idle_span(s, {});
  CHECK(heap.yield_idle_spans() == 12 * MiB);
  SECTION("all of it decommitted") {
    CHECK(heap.trim(0) == 12 * MiB);
    CHECK(f.tracker->committed() == 4 * MiB);
  }
  SECTION("half of it decommitted, the rest free") {
    CHECK(heap.trim(6 * MiB) == 6 * MiB);  // the highest address first: y's commit
    CHECK(heap.stats().free_bytes == 6 * MiB);
  }
  heap.check();
  const std::size_t commits = f.tracker->commits();
  const auto h = heap.hold_span(s, stream(3));
  REQUIRE(h.has_value());
  CHECK_FALSE(h->moved);
  CHECK(s.home == home);
  CHECK(s.now == state::held);
  CHECK(f.tracker->commits() > commits);
  CHECK(f.tracker->committed() == 16 * MiB);
  stamp(bytes_of(s), 0x9);
  heap.check();
  CHECK(stamped(bytes_of(s), 0x9));
  CHECK(heap.stats().events.span_moves == 0);
  heap.give_back(before, {});
  heap.give_back(after, {});
  heap.give_back_span(&s, {});
  heap.free_all();
  CHECK(f.tracker->held() == 0);
}

TEST_CASE("idle and held again without a yield: the same bytes, the streams it was left with to wait for",
          "[segments][spans]") {
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  segment_span& s = must_carve_span(heap, 3 * MiB);
  stamp(bytes_of(s), 0x3);
  stream_set used(stream(1));
  used.add(stream(2));
  heap.idle_span(s, used);
  const auto h = heap.hold_span(s, stream(1));
  REQUIRE(h.has_value());
  CHECK_FALSE(h->moved);
  CHECK(h->waits.size() == 1);
  CHECK(has(h->waits, stream(2)));
  CHECK(stamped(bytes_of(s), 0x3));
  const auto again = heap.hold_span(s, stream(1));  // held already: nothing to do
  REQUIRE(again.has_value());
  CHECK(again->waits.empty());
  // After a device-wide wait an idle span's users are done too.
  heap.idle_span(s, stream_set(stream(2)));
  heap.forget_streams();
  const auto after_wait = heap.hold_span(s, stream(1));
  REQUIRE(after_wait.has_value());
  CHECK(after_wait->waits.empty());
  heap.give_back_span(&s, {});
  heap.check();
}

TEST_CASE("a span grows in place into free bytes and holes after it, never over a piece", "[segments][spans]") {
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  segment_span& s = must_carve_span(heap, 4 * MiB);
  const std::uintptr_t home = s.home;
  stamp(bytes_of(s), 0x4);
  // At the tail: committed as it grows.
  auto grown = heap.extend_span(s, 9 * MiB, {});
  REQUIRE(grown.has_value());
  CHECK(s.home == home);
  CHECK(s.bytes == 9 * MiB);
  CHECK(heap.stats().span_bytes == 9 * MiB);
  heap.check();
  // Pieces grow from the segment's base, apart from spans: this one is placed right after it.
  const auto low = must_carve(heap, 2 * MiB);
  CHECK(addr(low) < home);
  const auto exact = heap.carve_exact(home + 9 * MiB, 2 * MiB, {});
  REQUIRE(exact.has_value());
  const auto p = exact->p;
  CHECK_FALSE(heap.extend_span(s, 10 * MiB, {}).has_value());  // a piece is in the way
  CHECK(s.bytes == 9 * MiB);
  heap.give_back(p, stream(6));
  grown = heap.extend_span(s, 10 * MiB, {});  // free bytes now, with the piece's stream to wait for
  REQUIRE(grown.has_value());
  CHECK(has(*grown, stream(6)));
  CHECK(s.bytes == 10 * MiB);
  REQUIRE(heap.extend_span(s, 3 * MiB, {}).has_value());  // already as large: nothing changes
  CHECK(s.bytes == 10 * MiB);
  CHECK(stamped({s.address(), 4 * MiB, 0, s.node}, 0x4));
  heap.give_back(low, {});
  heap.check();
  heap.give_back_span(&s, {});
  heap.free_all();
  CHECK(f.tracker->held() == 0);
}

TEST_CASE("without virtual memory spans are pieces of backend allocations, held again where they were",
          "[segments][spans]") {
  heap_fixture f;
  segment_heap heap(f.be, plain_options());
  segment_span& s = must_carve_span(heap, 5 * MiB);
  const std::uintptr_t home = s.home;
  heap.idle_span(s, {});
  const std::size_t allocations = f.tracker->allocations();
  const auto p = heap.carve(16 * MiB, {});  // no free range fits: the idle span's segment does
  REQUIRE(p.has_value());
  CHECK(f.tracker->allocations() == allocations);
  CHECK(s.now == state::yielded);
  heap.give_back(p->p, {});
  const auto h = heap.hold_span(s, {});
  REQUIRE(h.has_value());
  CHECK_FALSE(h->moved);
  CHECK(s.home == home);
  heap.check();
  heap.give_back_span(&s, {});
  heap.free_all();
  CHECK(f.tracker->held() == 0);
}

TEST_CASE("out of memory and backend errors while a span is placed leave the heap as it was",
          "[segments][spans][faults]") {
  using how = fault_schedule::failure;
  const auto failure = GENERATE(how::out_of_memory, how::backend_error);
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  const auto before = must_carve(heap, 2 * MiB);
  segment_span& s = must_carve_span(heap, 12 * MiB);
  const auto after = must_carve(heap, 2 * MiB);
  heap.idle_span(s, {});
  heap.yield_idle_spans();
  heap.trim(0);  // its home is a hole: holding it again commits
  const auto was = heap.stats();
  const auto ranges = heap.ranges();
  f.failing->arm(1, 100, failure);  // every call fails: at home, and elsewhere
  if (failure == how::out_of_memory) {
    CHECK_FALSE(heap.hold_span(s, {}).has_value());
    CHECK_FALSE(heap.carve_span(4 * MiB, {}).has_value());
  } else {
    CHECK_THROWS_AS(heap.hold_span(s, {}), backend_error);
    CHECK_THROWS_AS(heap.carve_span(4 * MiB, {}), backend_error);
  }
  f.failing->disarm();
  heap.check();
  CHECK(s.now == state::yielded);
  CHECK(heap.stats().committed_bytes == was.committed_bytes);
  CHECK(heap.stats().spans == 1);
  CHECK(heap.ranges().size() == ranges.size());
  CHECK(f.be.outstanding_bytes() == was.committed_bytes);
  REQUIRE(heap.hold_span(s, {}).has_value());  // and it works once memory is there
  CHECK(heap.stats().events.span_moves == 0);
  heap.give_back(before, {});
  heap.give_back(after, {});
  heap.give_back_span(&s, {});
  heap.free_all();
  CHECK(f.tracker->held() == 0);
}

TEST_CASE("the Nth backend call of a span's life fails, for every N: consistent, nothing leaked",
          "[segments][spans][faults]") {
  const bool vm = GENERATE(false, true);
  std::uint64_t n = 1;
  for (;; ++n) {
    heap_fixture f;
    {
      segment_heap heap(f.be, vm ? span_options() : plain_options());
      f.failing->arm(n, 1, fault_schedule::failure::out_of_memory);
      std::vector<segment_heap::piece> pieces;
      segment_span* s = nullptr;
      const auto try_carve = [&](std::size_t bytes) {
        if (auto c = heap.carve(bytes, {})) pieces.push_back(c->p);
        heap.check();
      };
      try_carve(3 * MiB);
      if (auto c = heap.carve_span(10 * MiB, {})) s = c->span;
      try_carve(1 * MiB);
      if (s != nullptr) {
        (void)heap.extend_span(*s, 14 * MiB, {});
        heap.check();
        heap.idle_span(*s, {});
      }
      try_carve(12 * MiB);  // may take the idle span's bytes
      heap.trim(0);
      if (s != nullptr && !heap.hold_span(*s, {}).has_value()) CHECK(s->now == state::yielded);
      heap.check();
      for (const auto& p : pieces) heap.give_back(p, {});
      if (s != nullptr) heap.give_back_span(s, {});
      const bool injected = f.failing->injected() != 0;
      heap.free_all();
      heap.check();
      if (!injected) break;
    }
    INFO("call " << n);
    CHECK(f.tracker->held() == 0);
    CHECK(f.tracker->reserved() == 0);
    CHECK(f.tracker->bad_releases() == 0);
    CHECK(f.be.outstanding_bytes() == 0);
  }
  CHECK(n > 2);  // the scenario reached the backend several times
}

TEST_CASE("spans grow apart from pieces: a piece larger than a yielded span commits only what it lacks, beside it",
          "[segments][spans]") {
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  segment_span& s = must_carve_span(heap, 8 * MiB);
  const auto low = must_carve(heap, 4 * MiB);  // from the segment's base, not right after the span
  CHECK(addr(low) + low.bytes < s.home);
  heap.idle_span(s, {});
  const std::size_t committed = heap.stats().committed_bytes;
  // 10 MiB: the span's 8 MiB yielded, and 2 MiB committed beside them (at the span's tail, it
  // would have been 10 MiB more: the span's bytes hemmed in by the piece after it).
  const auto big = must_carve(heap, 10 * MiB);
  CHECK(s.now == state::yielded);
  CHECK((addr(big) < s.home + s.bytes && s.home < addr(big) + big.bytes));
  CHECK(heap.stats().committed_bytes - committed == 2 * MiB);
  heap.check();
  heap.give_back(big, {});
  heap.give_back(low, {});
  const auto again = heap.hold_span(s, {});  // its home is free: back there
  REQUIRE(again.has_value());
  CHECK_FALSE(again->moved);
  heap.check();
  heap.give_back_span(&s, {});
  heap.free_all();
  CHECK(f.tracker->held() == 0);
}

TEST_CASE("a span that needs growth grows apart from the free bytes, which the heap leaves alone",
          "[segments][spans]") {
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  const auto freed = must_carve(heap, 6 * MiB);
  const auto pin = must_carve(heap, 2 * MiB);  // keeps the freed bytes from the tail
  heap.give_back(freed, {});
  const auto before = heap.stats();
  // 8 MiB fits no free range: the span commits its own bytes in the span half; the 6 free MiB stay
  // (the plan layer gives the plain path's idle memory back before a claim that may grow: arena::take).
  segment_span& s = must_carve_span(heap, 8 * MiB);
  CHECK(heap.stats().committed_bytes == before.committed_bytes + 8 * MiB);
  CHECK(heap.stats().free_bytes == before.free_bytes);
  CHECK(s.home >= addr(pin) + pin.bytes);
  heap.check();
  // Where a free range holds it, a span takes it as a piece would: no backend call.
  const std::size_t commits = f.tracker->commits();
  segment_span& fits = must_carve_span(heap, 4 * MiB);
  CHECK(fits.home == addr(freed));
  CHECK(f.tracker->commits() == commits);
  heap.give_back_span(&fits, {});
  heap.give_back_span(&s, {});
  heap.give_back(pin, {});
  heap.check();
  heap.free_all();
  CHECK(f.tracker->held() == 0);
}
