// Spans that grow in the upper half of a reservation (span_floor): the heap's contract for failed
// calls, that the heap itself gives no free commits back for a span (the plan layer gives the plain
// path's idle memory back before an arena's first claim after a plan joined: arena::take), and heaps
// with no spans, which must grow as they did before spans had a half of their own.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include <refpool/error.hpp>

#include "support/fault_injection.hpp"
#include "support/forwarding_resource.hpp"
#include "white_box/segment_fixture.hpp"

using namespace refpool;
using detail::segment_heap;
using detail::segment_span;
using detail::stream_set;
using refpool::test::addr;
using refpool::test::heap_fixture;
using refpool::test::MiB;
using refpool::test::span_options;

namespace {

segment_heap::piece must_carve(segment_heap& heap, std::size_t bytes) {
  auto c = heap.carve(bytes, {});
  REQUIRE(c.has_value());
  return c->p;
}

/// The heap as a failed call must leave it: what it holds of the backend, and its ranges.
struct heap_image {
  std::size_t committed, reserved, free, segments;
  std::vector<std::pair<std::uintptr_t, std::size_t>> commits;
  std::vector<std::uintptr_t> range_addresses;

  explicit heap_image(const segment_heap& heap) {
    const auto st = heap.stats();
    committed = st.committed_bytes;
    reserved = st.reserved_bytes;
    free = st.free_bytes;
    segments = st.segments;
    commits = heap.commits();
    for (const auto& r : heap.ranges()) range_addresses.push_back(r.address);
  }
  bool operator==(const heap_image& o) const {
    return committed == o.committed && reserved == o.reserved && free == o.free && segments == o.segments &&
           commits == o.commits && range_addresses == o.range_addresses;
  }
};

/// Host memory with virtual memory whose reservations a test refuses (the heap falls back to
/// backend allocations) and stream orders it refuses (as during a graph capture).
class refusing_host final : public test::forwarding_resource {
 public:
  refusing_host() : vm_(*upstream_->address_space()) {}
  virtual_memory* address_space() noexcept override { return &vm_; }
  void order_streams(stream_ref producer, stream_ref consumer) override {
    if (refuse_orders) throw stream_order_unavailable("refusing_host: orders refused (a graph capture)", 900);
    upstream_->order_streams(producer, consumer);
  }
  fault_schedule& schedule() { return vm_.schedule(); }
  bool refuse_orders = false;

 private:
  failing_virtual_memory vm_;
};

}  // namespace

TEST_CASE("a span whose growth fails leaves the heap as it was, its free commits too", "[segments][spans][faults]") {
  using how = fault_schedule::failure;
  const auto failure = GENERATE(how::out_of_memory, how::backend_error);
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  const auto freed = must_carve(heap, 6 * MiB);
  const auto pin = must_carve(heap, 2 * MiB);  // keeps the freed bytes from the tail
  heap.give_back(freed, {});
  REQUIRE(heap.stats().free_bytes == 6 * MiB);
  const heap_image was(heap);
  // 8 MiB fits no free range: the span must grow, and every commit fails.
  f.failing->arm_only(fault_schedule::commits, 1, 100, failure);
  if (failure == how::out_of_memory)
    CHECK_FALSE(heap.carve_span(8 * MiB, {}).has_value());
  else
    CHECK_THROWS_AS(heap.carve_span(8 * MiB, {}), backend_error);
  f.failing->disarm();
  heap.check();
  // segment_heap.hpp: "Whatever is thrown or returned, the heap is unchanged by a failed call."
  CHECK(heap_image(heap) == was);
  CHECK(heap.stats().free_bytes == 6 * MiB);
  CHECK(heap.stats().events.decommits == 0);
  heap.give_back(pin, {});
  heap.free_all();
  CHECK(f.tracker->held() == 0);
}

TEST_CASE("a yielded span held again elsewhere, out of memory, leaves the heap's free commits as they were",
          "[segments][spans][faults]") {
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  auto made = heap.carve_span(8 * MiB, {});
  REQUIRE(made.has_value());
  segment_span& s = *made->span;
  const auto freed = must_carve(heap, 6 * MiB);  // a commit of its own, below the span
  const auto pin = must_carve(heap, 2 * MiB);
  heap.give_back(freed, {});
  heap.idle_span(s, {});
  const auto over = must_carve(heap, 7 * MiB);  // fits no free range: yields the span, takes its home
  REQUIRE(s.now == segment_span::state::yielded);
  const heap_image was(heap);
  REQUIRE(was.free >= 6 * MiB);
  f.failing->arm_only(fault_schedule::commits | fault_schedule::reservations | fault_schedule::allocations, 1, 100);
  CHECK_FALSE(heap.hold_span(s, {}).has_value());
  f.failing->disarm();
  heap.check();
  CHECK(s.now == segment_span::state::yielded);
  CHECK(heap_image(heap) == was);
  heap.give_back(over, {});
  heap.give_back(pin, {});
  heap.give_back_span(&s, {});
  heap.free_all();
  CHECK(f.tracker->held() == 0);
}

TEST_CASE("a span that must grow gives back no free commits in the heap, whole free segments least of all",
          "[segments][spans]") {
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  // The small pool's segment: 40 MiB committed, all of it free after.
  std::vector<segment_heap::piece> small;
  for (int i = 0; i < 40; ++i) small.push_back(must_carve(heap, MiB));
  for (const auto& p : small) heap.give_back(p, {});
  const auto before = heap.stats();
  REQUIRE(before.free_bytes >= 40 * MiB);
  REQUIRE(before.segments == 1);
  // A large span of 4 MiB: nothing of the large pool fits it, so it grows; the small pool's free
  // segment stays (what the plain path holds idle goes back where the plan layer decides: arena::take).
  auto made = heap.carve_span(4 * MiB, {});
  REQUIRE(made.has_value());
  const auto after = heap.stats();
  INFO("free before " << before.free_bytes << ", after " << after.free_bytes);
  CHECK(after.free_bytes + 4 * MiB >= before.free_bytes);
  CHECK(after.events.segments_freed == 0);
  heap.check();
  heap.give_back_span(made->span, {});
  heap.free_all();
  CHECK(f.tracker->held() == 0);
}

TEST_CASE("without spans a hole inside the growable segment commits what the piece needs, wherever it lies",
          "[segments]") {
  heap_fixture f;
  auto options = span_options();
  options.growth_divisor = 16;  // tail steps of 8 MiB up to 128 MiB committed, then more
  segment_heap heap(f.be, options);
  // 17 pieces of 8 MiB and one of 10 MiB: one commit each, [0, 146) MiB from the base.
  std::vector<segment_heap::piece> pieces;
  for (int i = 0; i < 17; ++i) pieces.push_back(must_carve(heap, 8 * MiB));
  pieces.push_back(must_carve(heap, 10 * MiB));
  const std::uintptr_t base = addr(pieces.front());
  REQUIRE(heap.commits().size() == 18);
  // Free [96, 136) MiB and decommit it: a hole inside the segment, across its middle (128 MiB).
  std::vector<segment_heap::piece> kept;
  for (const auto& p : pieces) {
    if (addr(p) >= base + 96 * MiB && addr(p) + p.bytes <= base + 136 * MiB)
      heap.give_back(p, {});
    else
      kept.push_back(p);
  }
  heap.trim(0);
  heap.check();
  REQUIRE(heap.stats().free_bytes == 0);
  REQUIRE(heap.commits().size() == 13);
  // A 4 MiB piece: the hole inside is preferred to the tail on a tie, and commits the 4 MiB it
  // needs, as a hole inside a segment always did (fill_hole: only the growable tail grows by steps).
  const std::size_t committed = heap.stats().committed_bytes;
  const auto in_hole = must_carve(heap, 4 * MiB);
  CHECK(addr(in_hole) == base + 96 * MiB);
  CHECK(heap.stats().committed_bytes - committed == 4 * MiB);
  heap.check();
  heap.give_back(in_hole, {});
  for (const auto& p : kept) heap.give_back(p, {});
  heap.free_all();
  CHECK(f.tracker->held() == 0);
}

TEST_CASE("span_floor edge cases: a span over half the reservation, a halved reservation, the small pool",
          "[segments][spans]") {
  heap_fixture f;
  segment_heap heap(f.be, span_options());
  SECTION("a span larger than half a reservation ends at the reservation's end; pieces below it") {
    auto big = heap.carve_span(200 * MiB, {});
    REQUIRE(big.has_value());
    segment_span& s = *big->span;
    const auto l = heap.layout();
    REQUIRE(l.size() == 1);
    CHECK(s.home == l[0].base + 56 * MiB);
    heap.check();
    const auto p = must_carve(heap, 30 * MiB);
    CHECK(addr(p) == l[0].base);
    CHECK_FALSE(heap.extend_span(s, 202 * MiB, {}).has_value());  // no room after it
    heap.idle_span(s, {});
    const auto q = must_carve(heap, 100 * MiB);  // the span yields
    CHECK(s.now == segment_span::state::yielded);
    heap.check();
    heap.trim(0);
    heap.check();
    heap.give_back(p, {});
    heap.give_back(q, {});
    heap.trim(0);
    heap.check();
    auto again = heap.hold_span(s, {});
    REQUIRE(again.has_value());
    heap.check();
    heap.give_back_span(&s, {});
  }
  SECTION("a refused reservation: the floor of the halved one") {
    f.failing->arm_only(fault_schedule::reservations, 1, 1);
    auto made = heap.carve_span(8 * MiB, {});
    REQUIRE(made.has_value());
    const auto l = heap.layout();
    REQUIRE(l.size() == 1);
    CHECK(l[0].reserved == 128 * MiB);
    CHECK(made->span->home == l[0].base + 64 * MiB);
    const auto p = must_carve(heap, 3 * MiB);
    CHECK(addr(p) == l[0].base);
    heap.check();
    heap.give_back(p, {});
    heap.trim(0);
    heap.check();
    heap.give_back_span(made->span, {});
  }
  SECTION("a span of the small pool, and pieces of one physical allocation beside it") {
    auto made = heap.carve_span(300 * 1024, {});
    REQUIRE(made.has_value());
    segment_span& s = *made->span;
    const auto l = heap.layout();
    REQUIRE(l.size() == 1);
    CHECK(s.home == l[0].base + 128 * MiB);
    auto one = heap.carve(900 * 1024, {}, detail::placement::one_physical_allocation);
    REQUIRE(one.has_value());
    CHECK(heap.physical_allocations(one->p) == 1);
    heap.idle_span(s, {});
    std::vector<segment_heap::piece> ps;
    for (int i = 0; i < 8; ++i) {
      auto c = heap.carve(1000 * 1024, {}, detail::placement::one_physical_allocation);
      REQUIRE(c.has_value());
      CHECK(heap.physical_allocations(c->p) == 1);
      ps.push_back(c->p);
    }
    heap.check();
    for (const auto& p : ps) heap.give_back(p, {});
    heap.give_back(one->p, {});
    heap.trim(0);
    heap.check();
    REQUIRE(heap.hold_span(s, {}).has_value());
    heap.check();
    heap.give_back_span(&s, {});
  }
  heap.trim(0);
  heap.check();
  heap.free_all();
  CHECK(f.tracker->held() == 0);
  CHECK(f.be.outstanding_bytes() == 0);
}

TEST_CASE("the Nth backend call fails while spans grow past free commits, for every N: consistent, nothing leaked",
          "[segments][spans][faults]") {
  using how = fault_schedule::failure;
  const auto failure = GENERATE(how::out_of_memory, how::backend_error);
  std::uint64_t n = 1;
  for (;; ++n) {
    heap_fixture f;
    bool injected = false;
    {
      segment_heap heap(f.be, span_options());
      const auto freed = must_carve(heap, 6 * MiB);
      const auto pin = must_carve(heap, 2 * MiB);
      heap.give_back(freed, {});
      f.failing->arm(n, 1, failure);
      std::vector<segment_span*> spans;
      std::vector<segment_heap::piece> pieces;
      const auto attempt = [&](auto&& call) {
        try {
          call();
        } catch (const backend_error&) {}
        heap.check();
      };
      attempt([&] {
        if (auto c = heap.carve_span(8 * MiB, {})) spans.push_back(c->span);
      });
      attempt([&] {
        if (auto c = heap.carve(5 * MiB, {})) pieces.push_back(c->p);
      });
      for (segment_span* s : spans) heap.idle_span(*s, {});
      attempt([&] {
        if (auto c = heap.carve(7 * MiB, {})) pieces.push_back(c->p);  // may yield the span
      });
      attempt([&] {
        if (auto c = heap.carve_span(12 * MiB, {})) spans.push_back(c->span);
      });
      for (segment_span* s : spans)
        attempt([&] {
          if (s->now != segment_span::state::held) (void)heap.hold_span(*s, {});
        });
      for (const auto& p : pieces) heap.give_back(p, {});
      heap.give_back(pin, {});
      for (segment_span* s : spans) heap.give_back_span(s, {});
      heap.check();
      injected = f.failing->injected() != 0;
      heap.free_all();
    }
    INFO("call " << n);
    CHECK(f.tracker->held() == 0);
    CHECK(f.tracker->reserved() == 0);
    CHECK(f.tracker->bad_releases() == 0);
    CHECK(f.be.outstanding_bytes() == 0);
    if (!injected) break;
  }
  CHECK(n > 3);
}

TEST_CASE("a span that must grow orders no stream of the free segments it leaves alone", "[segments][spans][faults]") {
  auto host = std::make_shared<refusing_host>();
  backend be(host);
  REQUIRE(be.underlying().address_space() != nullptr);
  {
    segment_heap heap(be, span_options());
    REQUIRE(heap.uses_virtual_memory());
    // Every reservation refused: two pieces in backend allocations of their own (20 and 18 MiB).
    host->schedule().arm_only(fault_schedule::reservations, 1, 1000);
    const auto one = must_carve(heap, 4 * MiB);
    const auto two = must_carve(heap, 18 * MiB);
    host->schedule().disarm();
    REQUIRE(heap.stats().segments == 2);
    REQUIRE(one.segment != two.segment);
    heap.give_back(one, stream_set(test::stream(1)));  // one stream: freed without an order
    stream_set both(test::stream(1));
    both.add(test::stream(2));
    heap.give_back(two, both);  // two streams: freeing it orders them, which is refused
    host->refuse_orders = true;
    // 24 MiB fits neither: the span grows; freeing the segments would order their streams, which
    // is refused, and the heap does not try (nothing to trim at a carve).
    auto made = heap.carve_span(24 * MiB, test::stream(3));
    REQUIRE(made.has_value());
    heap.check();
    CHECK(heap.stats().segments == 3);  // both free segments kept, and the span's
    CHECK(heap.stats().free_bytes >= 22 * MiB);
    host->refuse_orders = false;
    heap.give_back_span(made->span, {});
    heap.trim(0);
    heap.check();
    CHECK(heap.stats().segments == 0);
    heap.free_all();
  }
  CHECK(be.outstanding_bytes() == 0);
}
