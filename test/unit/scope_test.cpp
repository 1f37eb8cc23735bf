// Scope rules: uncached guard, warm-up entries, ordering errors, threads with their own scopes.
#include <catch2/catch.hpp>

#include <array>
#include <exception>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include <refpool/refpool.hpp>

#include "support/error_matchers.hpp"
#include "support/host_fixture.hpp"
#include "support/in_child.hpp"

using namespace refpool;
using Catch::Contains;
using refpool::test::host_fixture;
using refpool::test::what;

TEST_CASE_METHOD(host_fixture, "an uncached guard sends allocations straight to the backend", "[scope][uncached]") {
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

TEST_CASE_METHOD(host_fixture, "warm-up entries run uncached and are counted", "[scope][warmup]") {
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

TEST_CASE_METHOD(host_fixture, "closing a scope out of order throws scope_error and keeps it open", "[scope][errors]") {
  scope outer(cache);
  auto inner = std::make_unique<scope>(cache);
  CHECK_THROWS_MATCHES(
      outer.close(), scope_error,
      what(Contains("scope was closed out of order") && Contains("opened after it on this thread is still open")));
  CHECK(caching_active());
  inner.reset();
  outer.close();
  outer.close();  // idempotent
  CHECK_FALSE(caching_active());
}

TEST_CASE_METHOD(host_fixture, "closing a scope on another thread throws scope_error", "[scope][errors][threads]") {
  scope s(cache);
  std::exception_ptr thrown;
  std::thread([&] {
    try {
      s.close();
    } catch (...) {
      thrown = std::current_exception();
    }
  }).join();
  REQUIRE(thrown != nullptr);
  CHECK_THROWS_MATCHES(std::rethrow_exception(thrown), scope_error,
                       what(Contains("not open on this thread") && Contains("on the thread that opened")));
  CHECK(caching_active());  // still open here
  s.close();
  CHECK_FALSE(caching_active());
}

TEST_CASE_METHOD(host_fixture, "destroying a scope out of order terminates with a clear message", "[scope][errors]") {
  const auto [aborted, output] = refpool::test::in_child([&] {
    auto outer = std::make_unique<scope>(cache);
    scope inner(cache);
    outer.reset();  // the destructor cannot throw: it must terminate
  });
  CHECK(aborted);
  CHECK_THAT(output, Contains("closed out of order"));
}

TEST_CASE_METHOD(host_fixture, "threads with their own scopes on one cache reuse their own blocks",
                 "[scope][threads]") {
  constexpr int thread_count = 4;
  constexpr int iterations = 100;
  const auto floats = [](int t) { return std::size_t{1024} + 64 * static_cast<std::size_t>(t); };  // a size each
  // The first scopes of all threads are open at once, so each thread leases a slot of its own;
  // every later scope of a thread gets that slot back, with the thread's block idle in it.
  std::latch first_scopes_open(thread_count);
  std::array<std::vector<void*>, thread_count> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < thread_count; ++t) {
    threads.emplace_back([&, t] {
      for (int iteration = 0; iteration < iterations; ++iteration) {
        scope s(cache);
        auto a = empty<float>(be, {floats(t)});
        auto b = a.reshape({2, floats(t) / 2});
        b.data()[0] = 1.0f;
        seen[t].push_back(a.data());
        if (iteration == 0) first_scopes_open.arrive_and_wait();
      }
    });
  }
  for (auto& t : threads) t.join();
  auto st = cache.stats();
  CHECK(st.hits + st.misses == thread_count * iterations);
  CHECK(st.misses == thread_count);  // one block per thread
  CHECK(st.steals == 0);             // every hit was the thread's own block, in its own slot
  for (const auto& pointers : seen) CHECK(std::vector<void*>(iterations, pointers.front()) == pointers);
  CHECK(st.live_blocks == 0);
  CHECK(st.idle_blocks == thread_count);
  CHECK(st.held_bytes == be.outstanding_bytes());

  // A thread that needs all four sizes at once finds one in the slot it leases and steals the
  // other three from the other threads' slots: the same blocks, no backend allocation.
  std::vector<void*> got;
  std::thread([&] {
    scope s(cache);
    std::vector<array<float>> all;
    for (int t = 0; t < thread_count; ++t) all.push_back(empty<float>(be, {floats(t)}));
    for (const auto& a : all) got.push_back(a.data());
  }).join();
  for (int t = 0; t < thread_count; ++t) CHECK(got[t] == seen[t].front());
  st = cache.stats();
  CHECK(st.misses == thread_count);
  CHECK(st.hits == thread_count * (iterations - 1) + thread_count);  // then the four blocks once more
  CHECK(st.steals == thread_count - 1);
  CHECK(be.allocation_count() == thread_count);
}

TEST_CASE_METHOD(host_fixture, "a scope started on another thread may take idle blocks of an ended one",
                 "[scope][threads]") {
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
  CHECK(st.steals == 1);  // the 99 floats, from the slot the holder leased
  CHECK(be.allocation_count() == 2);
}
