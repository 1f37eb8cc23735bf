// Scope rules: uncached guard, warm-up entries, ordering errors, threads with their own scopes.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <thread>

#include <refpool/refpool.hpp>

#include "in_child.hpp"

using namespace refpool;

TEST_CASE("an uncached guard sends allocations straight to the backend", "[scope][uncached]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  scope s(cache);
  CHECK(caching_active());
  array<float> result;
  {
    uncached_guard guard;
    CHECK_FALSE(caching_active());
    result = empty<float>(be, {64});
  }
  CHECK(caching_active());
  auto cached_one = empty<float>(be, {64});
  CHECK(cache.stats().misses == 1);  // only the cached allocation
  const std::size_t before = be.outstanding_bytes();
  result = {};
  CHECK(be.outstanding_bytes() == before - 256);  // freed on release, never kept
  CHECK(cache.stats().idle_blocks == 0);
  auto via_function = uncached([&] { return empty<float>(be, {3}); });
  CHECK(cache.stats().misses == 1);
}

TEST_CASE("warm-up entries run uncached and are counted", "[scope][warmup]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  const scope_options warmup{.uncached_warmup_entries = 2, .plan = {}};
  for (int iteration = 0; iteration < 5; ++iteration) {
    scope s(cache, warmup);
    CHECK(s.caching() == (iteration >= 2));
    auto workspace = empty<std::uint8_t>(be, {1 << 20});
    if (iteration < 2) {
      auto autotune_only = empty<std::uint8_t>(be, {8 << 20});  // never pinned by the cache
    }
  }
  const auto st = cache.stats();
  CHECK(st.scope_entries == 5);
  CHECK(st.uncached_entries == 2);
  CHECK(st.misses == 1);
  CHECK(st.hits == 2);
  CHECK(st.held_bytes == (1 << 20));
  CHECK(be.outstanding_bytes() == (1 << 20));
}

TEST_CASE("closing a scope out of order throws scope_error and keeps it open", "[scope][errors]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  scope outer(cache);
  auto inner = std::make_unique<scope>(cache);
  try {
    outer.close();
    FAIL("no exception");
  } catch (const scope_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("out of order"));
  }
  CHECK(caching_active());
  inner.reset();
  outer.close();
  outer.close();  // idempotent
  CHECK_FALSE(caching_active());
}

TEST_CASE("closing a scope on another thread throws scope_error", "[scope][errors][threads]") {
  alloc_cache cache{cache_options{}};
  scope s(cache);
  std::string message;
  std::thread([&] {
    try {
      s.close();
    } catch (const scope_error& e) {
      message = e.what();
    }
  }).join();
  CHECK_THAT(message, Catch::Contains("on the thread that opened"));
  s.close();
}

TEST_CASE("destroying a scope out of order terminates with a clear message", "[scope][errors]") {
  const auto [aborted, output] = test_support::in_child([] {
    alloc_cache cache{cache_options{}};
    auto outer = std::make_unique<scope>(cache);
    scope inner(cache);
    outer.reset();  // the destructor cannot throw: it must terminate
  });
  CHECK(aborted);
  CHECK_THAT(output, Catch::Contains("closed out of order"));
}

TEST_CASE("threads with their own scopes on one cache reuse their own blocks", "[scope][threads]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int iteration = 0; iteration < 100; ++iteration) {
        scope s(cache);
        auto a = empty<float>(be, {1024});
        auto b = a.reshape({32, 32});
        b.data()[0] = 1.0f;
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto st = cache.stats();
  CHECK(st.hits + st.misses == 400);
  CHECK(st.misses <= 4);  // at most one block per concurrent scope
  CHECK(st.live_blocks == 0);
  CHECK(st.held_bytes == be.outstanding_bytes());
}

TEST_CASE("a scope started on another thread may take idle blocks of an ended one", "[scope][threads]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  std::thread([&] {
    scope s(cache);
    auto a = empty<float>(be, {99});
  }).join();
  scope holder(cache);  // hold the first slot so the next scope gets another one
  auto keep = empty<float>(be, {1});
  std::thread([&] {
    scope s(cache);
    auto a = empty<float>(be, {99});
  }).join();
  const auto st = cache.stats();
  CHECK(st.misses == 2);  // 99 floats once, 1 float once
  CHECK(st.hits == 1);
}
