// What most host tests start from: a fresh host backend with its own counters (outstanding
// bytes and call counts start at zero, so they see only this test) and a cache with default
// options (exact keys, no idle limit; REFPOOL_CONF is not read). A Catch2 fixture,
//   TEST_CASE_METHOD(host_fixture, "name", "[tags]") { scope s(cache); auto a = empty<float>(be, {16}); }
// or a plain struct. The cache goes before the backend (members go in reverse order); a test
// that checks the backend after the cache is gone declares the two itself, the cache in a block.
#pragma once

#include <refpool/refpool.hpp>

namespace refpool::test {

struct host_fixture {
  const refpool::backend be = refpool::make_host_backend();
  refpool::alloc_cache cache{refpool::cache_options{}};
};

}  // namespace refpool::test
