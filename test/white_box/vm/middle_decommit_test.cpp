// Middle decommit (issue 23): trim gives back every commit of a segment that lies entirely in a
// free range, wherever it is, leaving an uncommitted hole; growth commits into holes (joined
// with the free ranges around them) before it grows a segment's tail. docs/segments.md,
// "Holes: decommit anywhere", states the rules.
#include <catch2/catch.hpp>

#include <cstring>
#include <utility>
#include <vector>

#include <refpool/refpool.hpp>

#include "access.hpp"
#include "cache/cache_state.hpp"
#include "white_box/segment_fixture.hpp"

using namespace refpool;
using detail::placement;
using detail::segment_heap;
using refpool::test::addr;
using refpool::test::heap_fixture;
using refpool::test::MiB;
using refpool::test::stamp;
using refpool::test::stamped;
using refpool::test::vm_options;

namespace {

segment_heap::piece must_carve(segment_heap& heap, std::size_t bytes, placement where = placement::anywhere) {
  auto c = heap.carve(bytes, {}, where);
  REQUIRE(c.has_value());
  return c->p;
}

using commit_list = std::vector<std::pair<std::uintptr_t, std::size_t>>;

// Pieces of `sizes` MiB carved in a row from a fresh heap: one commit each (growth steps are
// below the 2 MiB granule at this size), contiguous from the segment's base.
std::vector<segment_heap::piece> row_of(segment_heap& heap, std::initializer_list<std::size_t> sizes) {
  std::vector<segment_heap::piece> out;
  for (const std::size_t mib : sizes) out.push_back(must_carve(heap, mib * MiB));
  REQUIRE(heap.stats().physical_allocations == sizes.size());
  return out;
}

}  // namespace

TEST_CASE("55 MiB live on a 64 MiB device: the free commit in the middle goes back to make room",
          "[vm][middle-decommit]") {
  auto limited = std::make_shared<limiting_resource>(make_host_resource(), 64 * MiB);
  const backend be(limited);
  cache_options o;
  o.segments = segment_policy::on;
  alloc_cache cache{o};
  data_ref kept;
  {
    const data_ref first = cache.allocate(be, 30 * MiB);  // one commit of 30 MiB
    kept = cache.allocate(be, 4 * MiB);                   // the next commit, pinned: first's is in the middle
  }
  // Growth needs 51 MiB more than the 34 committed; only first's free commit can make room.
  const data_ref big = cache.allocate(be, 51 * MiB);
  std::memset(big.data(), 1, big.bytes());
  std::memset(kept.data(), 2, kept.bytes());
  CHECK(cache.stats().live_bytes == 55 * MiB);
  CHECK(limited->used() == 56 * MiB);  // 4 MiB and 51 MiB rounded up to the 2 MiB granule
  CHECK(cache.stats().oom_retries == 1);
  detail::access::state(cache).check_segments();
}

TEST_CASE("trim decommits a free commit in the middle; growth commits the hole before the tail",
          "[vm][middle-decommit]") {
  heap_fixture f;
  segment_heap heap(f.be, vm_options());
  const auto p = row_of(heap, {2, 6, 2});
  stamp(p[0], 0xa);
  stamp(p[2], 0xc);
  heap.give_back(p[1], {});
  CHECK(heap.trim(0) == 6 * MiB);
  heap.check();
  CHECK(heap.commits() == commit_list{{addr(p[0]), 2 * MiB}, {addr(p[2]), 2 * MiB}});
  CHECK(f.tracker->committed() == 4 * MiB);
  CHECK(f.limited->used() == 4 * MiB);
  CHECK(f.be.outstanding_bytes() == 4 * MiB);
  CHECK(heap.stats().events.decommits == 1);
  CHECK(heap.stats().free_bytes == 0);
  CHECK(stamped(p[0], 0xa));
  CHECK(stamped(p[2], 0xc));
  // The hole is committed again, what the request needs and no more, at its start.
  const auto d = must_carve(heap, 4 * MiB);
  CHECK(addr(d) == addr(p[1]));
  CHECK(heap.stats().committed_bytes == 8 * MiB);
  // Its rest ties with the tail (both need 2 MiB): the hole wins, the segment does not grow.
  const auto e = must_carve(heap, 2 * MiB);
  CHECK(addr(e) == addr(p[1]) + 4 * MiB);
  CHECK(heap.stats().committed_bytes == 10 * MiB);
  heap.check();
  for (const auto& q : {p[0], p[2], d, e}) heap.give_back(q, {});
  heap.free_all();
  CHECK(f.tracker->held() == 0);
  CHECK(f.tracker->reserved() == 0);
}

TEST_CASE("free ranges on both sides of a hole stay apart, and a commit of the hole joins them",
          "[vm][middle-decommit]") {
  heap_fixture f;
  segment_heap heap(f.be, vm_options());
  const auto p = row_of(heap, {2, 2, 2, 2, 2});
  heap.give_back(p[2], {});
  CHECK(heap.trim(0) == 2 * MiB);
  heap.give_back(p[1], {});
  heap.give_back(p[3], {});
  heap.check();  // two free ranges of 2 MiB that do not touch: never one range across the hole
  CHECK(heap.stats().free_ranges == 2);
  CHECK(heap.stats().largest_free_bytes == 2 * MiB);
  // 6 MiB: the whole hole (2 MiB) joins both neighbours; the tail would need 6 MiB.
  const auto q = must_carve(heap, 6 * MiB);
  CHECK(addr(q) == addr(p[1]));
  CHECK(heap.stats().committed_bytes == 10 * MiB);
  CHECK(heap.physical_allocations(q) == 3);
  heap.check();
  for (const auto& r : {p[0], p[4], q}) heap.give_back(r, {});
}

TEST_CASE("a request joined to the free range after a hole commits only the hole's end", "[vm][middle-decommit]") {
  heap_fixture f;
  segment_heap heap(f.be, vm_options());
  const auto p = row_of(heap, {2, 4, 2, 2});  // the 4 MiB piece is one commit
  heap.give_back(p[1], {});
  CHECK(heap.trim(0) == 4 * MiB);
  heap.give_back(p[2], {});  // free after the hole
  // 3 MiB: at the hole's start it needs 4 MiB, at its end 2 MiB joined to the free 2 MiB.
  const auto q = must_carve(heap, 3 * MiB);
  CHECK(addr(q) == addr(p[1]) + 2 * MiB);
  CHECK(heap.stats().committed_bytes == 8 * MiB);
  heap.check();
  for (const auto& r : {p[0], p[3], q}) heap.give_back(r, {});
}

TEST_CASE("one physical allocation fits a hole as a commit of its own", "[vm][middle-decommit]") {
  heap_fixture f;
  segment_heap heap(f.be, vm_options());
  const auto p = row_of(heap, {2, 4, 2});
  heap.give_back(p[1], {});
  CHECK(heap.trim(0) == 4 * MiB);
  const auto q = must_carve(heap, 3 * MiB, placement::one_physical_allocation);
  CHECK(addr(q) == addr(p[1]));
  CHECK(heap.physical_allocations(q) == 1);
  heap.check();
  for (const auto& r : {p[0], p[2], q}) heap.give_back(r, {});
}

TEST_CASE("trim(keep) decommits only until keep is met, the highest free commit first", "[vm][middle-decommit]") {
  heap_fixture f;
  segment_heap heap(f.be, vm_options());
  const auto p = row_of(heap, {2, 2, 2, 2, 2});
  heap.give_back(p[1], {});
  heap.give_back(p[3], {});
  CHECK(heap.trim(2 * MiB) == 2 * MiB);
  heap.check();
  // p[3]'s commit went (the highest), p[1]'s stayed: keep was met.
  CHECK(heap.commits() ==
        commit_list{{addr(p[0]), 2 * MiB}, {addr(p[1]), 2 * MiB}, {addr(p[2]), 2 * MiB}, {addr(p[4]), 2 * MiB}});
  CHECK(heap.stats().free_bytes == 2 * MiB);
  CHECK(heap.trim(0) == 2 * MiB);
  heap.check();  // after a trim that gave back all it could: no free whole commit is left
  for (const auto& r : {p[0], p[2], p[4]}) heap.give_back(r, {});
}

TEST_CASE("a free segment with holes goes back whole", "[vm][middle-decommit]") {
  heap_fixture f;
  segment_heap heap(f.be, vm_options());
  const auto p = row_of(heap, {2, 2, 2});
  heap.give_back(p[1], {});
  CHECK(heap.trim(0) == 2 * MiB);
  heap.give_back(p[0], {});
  heap.give_back(p[2], {});
  heap.check();
  CHECK(heap.trim(0) == 4 * MiB);
  CHECK(heap.stats().segments == 0);
  CHECK(f.tracker->held() == 0);
  CHECK(f.tracker->reserved() == 0);
  CHECK(f.tracker->bad_releases() == 0);
  CHECK(f.be.outstanding_bytes() == 0);
}
