// White-box: a cache's per-slot bookkeeping does not grow with every size it ever saw (issue 14,
// "a cache keeps every backend it ever saw alive": each slot kept a bucket per key forever).
#include <catch2/catch.hpp>

#include <algorithm>

#include <refpool/refpool.hpp>

#include "access.hpp"
#include "cache/cache_state.hpp"
#include "cache/hit_path.hpp"  // ambient_slot

using namespace refpool;

TEST_CASE("10,000 distinct sizes with reclaim keep a slot's bucket count bounded", "[cache][regression]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  detail::slot* s = detail::access::state(cache).ambient_slot();  // what cache.allocate uses here
  REQUIRE(s != nullptr);
  std::size_t most = 0;
  for (std::size_t i = 0; i < 10000; ++i) {
    data_ref r = cache.allocate(be, 64 + i);
    r = {};
    if (i % 100 == 99) cache.reclaim(0);
    most = std::max(most, s->buckets.size());
  }
  CHECK(most <= 100);  // at most the sizes seen since the last reclaim
  cache.reclaim(0);
  CHECK(s->buckets.size() == 0);
  CHECK(be.outstanding_bytes() == 0);
}
