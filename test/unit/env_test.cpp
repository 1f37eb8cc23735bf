// Behaviour under environment settings. Meson runs this program once per setting, each time
// selecting the test cases of that setting by tag (see test/meson.build).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <refpool/refpool.hpp>

#include "support/error_matchers.hpp"

using namespace refpool;
using Catch::Contains;
using Catch::EndsWith;
using refpool::test::what;

TEST_CASE("REFPOOL_NO_CACHING=1: scopes pass every request to the backend", "[env-bypass]") {
  REQUIRE(std::string(std::getenv("REFPOOL_NO_CACHING")) == "1");
  const backend be = make_host_backend();
  cache_options options;
  options.rounding = rounding_policy::step(4096);
  alloc_cache cache{options};
  for (int iteration = 0; iteration < 3; ++iteration) {
    scope s(cache);
    CHECK_FALSE(s.caching());
    auto a = empty<float>(be, {10});
    CHECK(a.ref().capacity() == 40);  // exact bounds: no rounding
    CHECK(be.outstanding_bytes() == 40);
  }
  CHECK(be.outstanding_bytes() == 0);  // freed on last release, never kept
  CHECK(be.allocation_count() == 3);
  const auto st = cache.stats();
  CHECK(st.hits + st.misses == 0);
  CHECK(st.uncached_entries == 3);
}

TEST_CASE("REFPOOL_CONF log and rounding: every allocation and free is logged as CSV", "[env-log]") {
  const char* path = std::getenv("REFPOOL_TEST_LOG");
  REQUIRE(path != nullptr);
  const backend be = make_host_backend();
  alloc_cache cache;  // options from REFPOOL_CONF
  CHECK(cache.rounding() == rounding_policy::step(512));
  CHECK(cache.max_idle_bytes() == 1 << 20);
  {
    scope s(cache);
    auto a = allocate(be, 100);
    CHECK(a.capacity() == 512);
    auto b = allocate(be, 200, stream_ref{reinterpret_cast<void*>(0x7)});
  }
  std::ifstream log(path);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(log, line)) lines.push_back(line);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0] == "Thread,Time,Action,Pointer,Size,Stream");
  CHECK_THAT(lines[1], Contains(",allocate,") && EndsWith(",100,0x0"));
  CHECK_THAT(lines[2], Contains(",allocate,") && EndsWith(",200,0x7"));
  CHECK_THAT(lines[3], Contains(",free,") && EndsWith(",200,0x7"));
  CHECK_THAT(lines[4], Contains(",free,") && EndsWith(",100,0x0"));
}

TEST_CASE("a bad REFPOOL_CONF gives config_error at first use", "[env-bad]") {
  const backend be = make_host_backend();
  CHECK_THROWS_MATCHES(alloc_cache(), config_error, what(Contains("unknown key 'colour'")));
  CHECK_THROWS_MATCHES(allocate(be, 8), config_error, what(Contains("unknown key 'colour'")));
  CHECK(be.outstanding_bytes() == 0);
}
