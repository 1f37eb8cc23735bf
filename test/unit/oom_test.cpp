// Out of memory: reclaim idle blocks of the failing backend, retry once, then a clear error.
// Backend errors other than OOM propagate unchanged. Nothing leaks either way.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <refpool/refpool.hpp>
#include "support/fault_injection.hpp"

#include "support/error_matchers.hpp"

using namespace refpool;
using Catch::Contains;
using refpool::test::oom_for;
using refpool::test::what;

TEST_CASE("out of memory reclaims idle blocks and retries", "[oom]") {
  auto limited = std::make_shared<limiting_resource>(make_host_resource(), 4096);
  const backend be(limited);
  alloc_cache cache{cache_options{}};
  scope s(cache);
  { auto a = allocate(be, 3000); }  // idle now, holding 3000 of 4096
  auto b = allocate(be, 2000);      // fails, reclaims the idle 3000, succeeds
  const auto st = cache.stats();
  CHECK(st.oom_retries == 1);
  CHECK(st.reclaimed_blocks == 1);
  CHECK(st.idle_bytes == 0);
  CHECK(limited->used() == 2000);
}

TEST_CASE("out of memory after reclaim throws an error naming sizes and cache state", "[oom][errors]") {
  auto limited = std::make_shared<limiting_resource>(make_host_resource(), 4096);
  const backend be(limited);
  alloc_cache cache{cache_options{}};
  scope s(cache);
  auto live = allocate(be, 3000);
  { auto idle = allocate(be, 1000); }
  CHECK_THROWS_MATCHES(allocate(be, 2048), out_of_memory,
                       oom_for(2048, -1) && what(Contains("allocate 2 KiB") && Contains("2.93 KiB live") &&
                                                 Contains("reclaiming 1000 B") && Contains("of host memory") &&
                                                 Contains("What to do")));
  const auto st = cache.stats();
  CHECK(st.oom_retries == 1);
  CHECK(st.ooms == 1);
  CHECK(st.live_bytes == 3000);
  CHECK(st.idle_bytes == 0);
  CHECK(limited->used() == 3000);
  live = {};
  CHECK(cache.reclaim() == 3000);
  CHECK(limited->used() == 0);
}

TEST_CASE("reclaim on OOM only touches the failing backend", "[oom]") {
  auto limited = std::make_shared<limiting_resource>(make_host_resource(), 1024);
  const backend small(limited);
  const backend other = make_host_backend();
  alloc_cache cache{cache_options{}};
  scope s(cache);
  { auto a = allocate(other, 512); }
  { auto b = allocate(small, 1024); }
  auto c = allocate(small, 600);  // reclaims small's idle 1024, not other's 512
  CHECK(other.outstanding_bytes() == 512);
  CHECK(limited->used() == 600);
  const auto st = cache.stats();
  CHECK(st.idle_bytes == 512);
  CHECK(st.oom_retries == 1);
  CHECK(st.reclaimed_blocks == 1);
}

TEST_CASE("a failing backend at every allocation leaves the cache consistent", "[oom][faults]") {
  // The Nth backend call fails, for every N of a scenario that makes K calls.
  const auto scenario = [](const backend& be) {
    alloc_cache cache{cache_options{}};
    std::vector<data_ref> keep;
    for (int iteration = 0; iteration < 3; ++iteration) {
      scope s(cache);
      auto a = empty<float>(be, {256});
      auto b = empty<float>(be, {512});
      a = {};
      auto c = empty<double>(be, {128});
      auto d = empty<float>(be, {static_cast<std::size_t>(64 * (iteration + 1))});
      if (iteration == 1) keep.push_back(d.ref());  // escapes its scope
    }
    keep.clear();
    return cache.stats();
  };
  auto host = make_host_resource();
  auto failing = std::make_shared<failing_resource>(host);
  const backend be(failing);
  const auto clean = scenario(be);
  const std::uint64_t calls = failing->calls();
  REQUIRE(calls == clean.backend_allocations);
  REQUIRE(be.outstanding_bytes() == 0);
  for (auto how : {failing_resource::failure::out_of_memory, failing_resource::failure::backend_error}) {
    for (std::uint64_t n = 1; n <= calls; ++n) {
      CAPTURE(n, static_cast<int>(how));
      failing->arm(n, how == failing_resource::failure::out_of_memory ? 2 : 1, how);  // OOM twice: the retry fails too
      if (how == failing_resource::failure::out_of_memory) {
        CHECK_THROWS_AS(scenario(be), out_of_memory);
      } else {
        CHECK_THROWS_AS(scenario(be), backend_error);
      }
      CHECK(be.outstanding_bytes() == 0);
      failing->arm(n, 1, failing_resource::failure::out_of_memory);  // once: the retry succeeds
      const auto recovered = scenario(be);
      CHECK(recovered.oom_retries == 1);
      CHECK(recovered.live_blocks == 0);
      CHECK(recovered.escapes == 1);
      CHECK(be.outstanding_bytes() == 0);
    }
  }
  failing->disarm();
  CHECK(failing->injected() == 5 * calls);  // OOM: 2 + 1 per n; backend error: 1 + 1 per n
}

TEST_CASE("out-of-memory messages: binary units, the host named as such, and what to do", "[oom][errors]") {
  constexpr std::size_t MiB = 1 << 20;
  auto limited = std::make_shared<limiting_resource>(make_host_resource(), 4 * MiB);
  const backend be(limited);
  const backend other = make_host_backend();
  alloc_cache cache{cache_options{}};
  scope s(cache);
  auto live = allocate(be, 3 * MiB);
  { auto idle = allocate(be, MiB / 2); }
  { auto elsewhere = allocate(other, MiB); }  // idle, of another backend: not reclaimed for be
  CHECK_THROWS_MATCHES(
      allocate(be, 2 * MiB), out_of_memory,
      oom_for(2 * MiB, -1) &&
          what(Contains("could not allocate 2 MiB (request 2 MiB) of host memory") && Contains("reclaiming 512 KiB") &&
               Contains("3 MiB live in 1 blocks and 1 MiB idle") &&
               Contains("What to do: release buffers no longer needed (3 MiB live in this cache)") &&
               Contains("1 MiB is reserved here but not handed out") && Contains("max_idle_bytes") &&
               !Contains("device -1") && !Contains("3145728")));
}

TEST_CASE("an uncached out-of-memory message says so, in binary units", "[oom][errors]") {
  auto limited = std::make_shared<limiting_resource>(make_host_resource(), 1 << 20);
  const backend be(limited);
  CHECK_THROWS_MATCHES(allocate(be, 3 << 20), out_of_memory,
                       what(Contains("could not allocate 3 MiB of host memory (an uncached allocation") &&
                            Contains("What to do")));
}
