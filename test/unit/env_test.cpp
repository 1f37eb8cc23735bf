// Behaviour under environment settings. Meson runs this program once per setting, each time
// selecting the test cases of that setting by tag (see test/meson.build).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
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

TEST_CASE("REFPOOL_NO_CACHING=on: scopes pass every request to the backend", "[env-bypass]") {
  REQUIRE(std::string(std::getenv("REFPOOL_NO_CACHING")) == "on");
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

namespace {

/// What `body` writes to stderr (file descriptor 2, where refpool prints).
template <class F>
std::string stderr_of(F&& body) {
  std::FILE* capture = std::tmpfile();
  REQUIRE(capture != nullptr);
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  REQUIRE(dup2(fileno(capture), STDERR_FILENO) == STDERR_FILENO);
  body();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string text;
  std::rewind(capture);
  for (int c; (c = std::fgetc(capture)) != EOF;) text += static_cast<char>(c);
  std::fclose(capture);
  return text;
}

}  // namespace

TEST_CASE("REFPOOL_CONF stats_at_exit: a destroyed cache prints its summary, or every counter with full",
          "[env-stats]") {
  const char* expected = std::getenv("REFPOOL_TEST_STATS");  // "summary" or "full"
  REQUIRE(expected != nullptr);
  const backend be = make_host_backend();
  const std::string printed = stderr_of([&] {
    alloc_cache cache;
    scope s(cache);
    auto a = allocate(be, std::size_t{3} << 20);
  });
  INFO(printed);
  CHECK_THAT(printed, Contains("refpool: cache ") && Contains(" destroyed:"));
  CHECK_THAT(printed, Contains("3 MiB") && !Contains("3145728"));  // binary units either way
  if (std::string(expected) == "summary") {
    CHECK_THAT(printed, Contains("requests") && Contains("reserved") && !Contains("backend_allocations"));
  } else {
    CHECK_THAT(printed, Contains("backend_allocations") && Contains("live_bytes") && !Contains("held_bytes"));
  }
}
