// Fault injection sweep: the Nth backend allocation fails, for every N of a scenario with many
// allocations, nested scopes, an uncached guard, escapes, unsafe_free and reclaim, run by two
// threads on one cache. Each run must either succeed (reclaim and retry) or throw
// out_of_memory / backend_error, and afterwards the cache and the backend must agree: no live
// block, held == idle == backend outstanding, and nothing left once the cache is gone.
#include <catch2/catch.hpp>

#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include <refpool/refpool.hpp>
#include "support/fault_injection.hpp"

using namespace refpool;

namespace {

enum class thrown { nothing, out_of_memory, backend_error, other };

struct run_result {
  thrown outcome[2] = {thrown::nothing, thrown::nothing};
  cache_stats stats;                  ///< after the escaped handles went, before the cache did
  std::size_t outstanding = 0;        ///< backend bytes at that moment
  std::size_t outstanding_after = 0;  ///< backend bytes once the cache was destroyed
};

constexpr int iterations = 6;
constexpr int sweeps = 3;  // the whole sweep again: the threads interleave differently each time

// One thread's work: 6 iterations of a loop body with a nested scope, an uncached result, a
// buffer that escapes, one given back with unsafe_free, and (thread 0) a reclaim.
void body(alloc_cache& cache, const backend& be, int tid, std::mutex& keep_mutex, std::vector<data_ref>& kept) {
  for (int it = 0; it < iterations; ++it) {
    scope s(cache);
    auto a = empty<float>(be, {256});
    auto b = empty<double>(be, {static_cast<std::size_t>(64 + 32 * tid)});
    {
      scope inner(cache);  // nested on the same cache: shares the outer scope's slot
      auto c = empty<std::uint8_t>(be, {1000});
      c.unsafe_free();
      auto d = empty<float>(be, {250});  // 1000 B: c's buffer, given back early
      d.data()[0] = 1.0f;
    }
    a = {};
    auto e = empty<float>(be, {static_cast<std::size_t>(64 * (it + 1))});
    if (it == 1) {
      std::lock_guard guard(keep_mutex);
      kept.push_back(e.ref());  // escapes its scope
    }
    {
      uncached_guard g;  // straight to the backend: an OOM here is not retried
      auto u = empty<float>(be, {16});
      u.data()[0] = 2.0f;
    }
    auto f = b.reshape({2, static_cast<std::size_t>(32 + 16 * tid)});
    if (tid == 0 && it == 2) cache.reclaim(512);
  }
}

run_result run_scenario(const backend& be) {
  run_result r;
  std::vector<data_ref> kept;
  std::mutex keep_mutex;
  {
    alloc_cache cache{cache_options{}};
    std::vector<std::thread> threads;
    for (int tid = 0; tid < 2; ++tid) {
      threads.emplace_back([&, tid] {
        try {
          body(cache, be, tid, keep_mutex, kept);
        } catch (const out_of_memory&) {
          r.outcome[tid] = thrown::out_of_memory;
        } catch (const backend_error&) {
          r.outcome[tid] = thrown::backend_error;
        } catch (...) {
          r.outcome[tid] = thrown::other;
        }
      });
    }
    for (auto& t : threads) t.join();
    kept.clear();
    r.stats = cache.stats();
    r.outstanding = be.outstanding_bytes();
  }
  r.outstanding_after = be.outstanding_bytes();
  return r;
}

int count(const run_result& r, thrown what) { return (r.outcome[0] == what ? 1 : 0) + (r.outcome[1] == what ? 1 : 0); }

void check_consistent(const run_result& r) {
  CHECK(r.outcome[0] != thrown::other);
  CHECK(r.outcome[1] != thrown::other);
  CHECK(r.stats.live_blocks == 0);
  CHECK(r.stats.live_bytes == 0);
  CHECK(r.stats.held_bytes == r.stats.idle_bytes);
  CHECK(r.stats.held_bytes == r.outstanding);
  CHECK(r.stats.backend_allocations - r.stats.backend_frees == r.stats.idle_blocks);
  CHECK(r.outstanding_after == 0);
}

}  // namespace

TEST_CASE("the Nth backend allocation fails, for every N, in a two-thread multi-scope scenario", "[faults]") {
  auto failing = std::make_shared<failing_resource>(make_host_resource());
  const backend be(failing);
  // The number of backend calls depends on how the threads interleave (steals save some): take
  // the largest of a few clean runs, and a margin.
  std::uint64_t calls = 0;
  for (int i = 0; i < 8; ++i) {
    failing->arm(0, 0);
    const run_result clean = run_scenario(be);
    check_consistent(clean);
    REQUIRE(count(clean, thrown::nothing) == 2);
    calls = std::max(calls, failing->calls());
  }
  REQUIRE(calls >= 12);
  const std::uint64_t sweep = calls + 4;
  const std::uint64_t injected_before = failing->injected();
  std::uint64_t runs = 0, retried = 0, oom_thrown = 0, error_thrown = 0;
  for (std::uint64_t n = 1, round = 0; round < sweeps; n = n == sweep ? (++round, 1) : n + 1) {
    CAPTURE(round, n);
    {  // once: a cached request reclaims, retries and succeeds; an uncached one throws
      failing->arm(n, 1, failing_resource::failure::out_of_memory);
      const run_result r = run_scenario(be);
      check_consistent(r);
      CHECK(count(r, thrown::backend_error) == 0);
      const int ooms = count(r, thrown::out_of_memory);
      CHECK(ooms <= 1);
      if (failing->calls() >= n) CHECK(r.stats.oom_retries + static_cast<std::uint64_t>(ooms) == 1);
      retried += r.stats.oom_retries;
      oom_thrown += static_cast<std::uint64_t>(ooms);
      ++runs;
    }
    {  // twice: if the retry is the second failure, out_of_memory; if another thread's call is, both retry
      failing->arm(n, 2, failing_resource::failure::out_of_memory);
      const run_result r = run_scenario(be);
      check_consistent(r);
      CHECK(count(r, thrown::backend_error) == 0);
      CHECK(r.stats.oom_retries <= 2);
      retried += r.stats.oom_retries;
      oom_thrown += static_cast<std::uint64_t>(count(r, thrown::out_of_memory));
      ++runs;
    }
    {  // a backend error is not out of memory: no reclaim, no retry, thrown unchanged
      failing->arm(n, 1, failing_resource::failure::backend_error);
      const run_result r = run_scenario(be);
      check_consistent(r);
      CHECK(count(r, thrown::out_of_memory) == 0);
      CHECK(r.stats.oom_retries == 0);
      CHECK(count(r, thrown::backend_error) == (failing->calls() >= n ? 1 : 0));
      error_thrown += static_cast<std::uint64_t>(count(r, thrown::backend_error));
      ++runs;
    }
  }
  failing->disarm();
  const std::uint64_t injected = failing->injected() - injected_before;
  CHECK(injected >= 3 * sweeps * calls);
  std::printf(
      "fault sweep: %llu runs, %d times N = 1..%llu (a clean run makes up to %llu backend calls), %llu faults "
      "injected: %llu answered by reclaim and retry, %llu out_of_memory and %llu backend_error thrown; "
      "every run left the cache consistent and nothing leaked\n",
      static_cast<unsigned long long>(runs), sweeps, static_cast<unsigned long long>(sweep),
      static_cast<unsigned long long>(calls), static_cast<unsigned long long>(injected),
      static_cast<unsigned long long>(retried), static_cast<unsigned long long>(oom_thrown),
      static_cast<unsigned long long>(error_thrown));
}

TEST_CASE("real out of memory under a byte limit, two threads: retry or a clean out_of_memory", "[faults]") {
  // No injection: limits from below one thread's working set (each thread needs 2,536 B or more
  // at once: every run ends in out_of_memory) to above both threads' (no thread fails), through
  // limits where reclaim-and-retry and out_of_memory both happen depending on the interleaving.
  constexpr std::size_t limits[] = {2500, 3500, 5000, 6000, 8000, 10000, 14000, 20000};
  constexpr int repeats = 10;
  std::uint64_t retried = 0, oom_thrown = 0, finished = 0;
  for (std::size_t limit : limits) {
    CAPTURE(limit);
    auto limited = std::make_shared<limiting_resource>(make_host_resource(), limit);
    const backend be(limited);
    int limit_ooms = 0;
    for (int repeat = 0; repeat < repeats; ++repeat) {
      const run_result r = run_scenario(be);
      check_consistent(r);
      CHECK(count(r, thrown::backend_error) == 0);
      CHECK(limited->used() == 0);
      retried += r.stats.oom_retries;
      limit_ooms += count(r, thrown::out_of_memory);
      finished += static_cast<std::uint64_t>(count(r, thrown::nothing));
    }
    if (limit == limits[0]) CHECK(limit_ooms == 2 * repeats);
    if (limit == limits[std::size(limits) - 1]) CHECK(limit_ooms == 0);
    oom_thrown += static_cast<std::uint64_t>(limit_ooms);
  }
  CHECK(retried > 0);
  CHECK(oom_thrown > 0);
  CHECK(finished > 0);
  std::printf(
      "byte limits: %zu limits x %d runs x 2 threads: %llu retries, %llu out_of_memory, %llu threads "
      "finished; every run left the cache consistent and nothing leaked\n",
      std::size(limits), repeats, static_cast<unsigned long long>(retried), static_cast<unsigned long long>(oom_thrown),
      static_cast<unsigned long long>(finished));
}
