// The window baa0bd0 and de7cf37 close for runs, opened on purpose for the arena's other claimants:
// a pinned region's release idles the span only when it can claim the arena (idle_if_unpinned), and
// a claimant that is no run (another release's idle_if_unpinned, the re-checks those commits added,
// the store growing or replacing the arena) unclaims without looking again. The test holds the claim
// as such a claimant would while the last pinned regions go, deterministically; the stress test
// plan-arena-idle finds the same state from real threads.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include <refpool/adaptors.hpp>
#include <refpool/refpool.hpp>

#include "access.hpp"
#include "cache/block.hpp"
#include "cache/region_block.hpp"
#include "plan/arena.hpp"
#include "plan/plan.hpp"

using namespace refpool;

namespace {

constexpr std::size_t kib = 1024;
constexpr std::size_t budget = 1024 * kib;
constexpr std::size_t region = 96 * kib;

struct fixture {
  std::shared_ptr<limiting_resource> limited = std::make_shared<limiting_resource>(make_host_resource(), budget);
  backend be{limited};
  alloc_cache cache{cache_options{.segments = segment_policy::off}};

  std::vector<data_ref> escaping_run() {
    std::vector<data_ref> out;
    scope s(cache, {.plan = "claims"});
    for (int i = 0; i < 2; ++i) {
      out.push_back(allocate(be, region));
      std::memset(out.back().data(), 1 + i, region);
    }
    return out;
  }
  // Runs until one replays and ends with both buffers pinned in its arena.
  std::vector<data_ref> pinned_pair() {
    for (int i = 0; i < 6; ++i) {
      const auto hits = cache.stats().plan_hits;
      std::vector<data_ref> out = escaping_run();
      if (cache.stats().plan_hits > hits && region_of(out[0]) != nullptr && region_of(out[1]) != nullptr) return out;
    }
    FAIL("no replay pinned both buffers");
    return {};
  }
  static detail::region_block* region_of(const data_ref& r) {
    auto* b = static_cast<detail::block*>(detail::access::block(r));
    return b->origin == detail::block_origin::region ? detail::as_region(b) : nullptr;
  }
  static detail::arena& arena_of(const data_ref& r) { return static_cast<detail::plan*>(region_of(r)->owner)->memory(); }
  bool budget_fits() {
    try {
      data_ref all = cache.allocate(be, budget);
    } catch (const out_of_memory&) {
      return false;
    }
    cache.reclaim(0);
    return true;
  }
};

}  // namespace

TEST_CASE("the last pinned regions released with no claimant beside them idle the span (control)",
          "[plan][arena-idle]") {
  fixture f;
  std::vector<data_ref> pinned = f.pinned_pair();
  pinned.clear();
  CHECK(f.cache.stats().live_bytes == 0);
  CHECK(f.budget_fits());
}

// Another release's idle_if_unpinned holds the claim and has read the second region live; the
// second region goes now, its own idle_if_unpinned finds the arena claimed and returns; the first
// unclaims without idling. Nothing is live and no run is open, yet the span stays held until the
// key's next run ends.
TEST_CASE("the last pinned region released while a claimant that is no run holds the arena", "[plan][arena-idle]") {
  fixture f;
  std::vector<data_ref> pinned = f.pinned_pair();
  detail::arena& a = fixture::arena_of(pinned[0]);
  const int token = 0;
  REQUIRE(a.claim(&token, nullptr));
  const bool unpinned_then = a.unpinned();  // what the claimant read: pinned
  pinned.clear();                           // both go; their idle_if_unpinned find it claimed
  a.unclaim();
  CHECK_FALSE(unpinned_then);
  CHECK(f.cache.stats().live_bytes == 0);
  CHECK(f.cache.stats().plan_live_bytes == 0);
  CHECK(f.budget_fits());  // fails on main (de7cf37): the span is held with nothing in it
  // Held until the key's next run: its end finds nothing pinned and idles the span.
  f.escaping_run().clear();
  CHECK(f.budget_fits());
}
