// Thread stress: T threads x N mixed operations on one cache, plus a thread that reclaims and
// changes max_idle_bytes all the while. Workers allocate stamped buffers (every word holds its
// owner's stamp), reshape and reinterpret them, hand them to other threads by copy (shared,
// read-only) or by move, give them back with unsafe_free (after which access must throw
// use_after_free), open nested scopes and uncached guards, and let some buffers escape their
// scopes. A buffer handed to two owners would show a foreign stamp (and a race under TSan).
//
//   stress_test [--threads T] [--ops N]     (defaults 16 and 1000000; REFPOOL_STRESS_OPS overrides N)
//
// Exits 0 when every check passed; prints the counts.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <refpool/refpool.hpp>

#include "support/stamped.hpp"
#include "support/stress_args.hpp"

using namespace refpool;
using refpool::test::first_foreign_byte;
using refpool::test::stamped_buffer;
using refpool::test::stamped_set;

namespace {

std::atomic<std::uint64_t> failures{0};

void check(bool ok, const char* what) {
  if (!ok && failures.fetch_add(1) < 20) fmt::print(stderr, "stress_test: FAILED: {}\n", what);
}

struct mailbox {
  static constexpr std::size_t capacity = 256;
  std::mutex mutex;
  stamped_set items;  // buffers on their way between threads, with their owners' stamps
};

struct counts {
  std::uint64_t ops = 0, allocations = 0, handoffs = 0, shared = 0, unsafe_frees = 0, use_after_free_seen = 0,
                escapes_kept = 0, reclaimer_ops = 0;
};

void worker(alloc_cache& cache, const backend& be, mailbox& box, int tid, std::uint64_t ops, counts& out) {
  std::mt19937_64 rng(0x5EED0000ull + static_cast<std::uint64_t>(tid));
  stamped_set mine;
  auto fresh = [&] {
    stamped_buffer o = mine.stamp(empty<std::uint64_t>(be, {std::size_t{1} << (rng() % 7)}));
    out.allocations += 1;
    return o;
  };
  auto drop_one = [&] {
    if (mine.empty()) return;
    check(mine.drop(rng() % mine.size()), "a buffer lost its owner's stamp before it was dropped");
  };
  std::uint64_t op = 0;
  while (op < ops) {
    scope s(cache);
    const std::uint64_t body = 1 + rng() % 64;
    for (std::uint64_t k = 0; k < body && op < ops; ++k, ++op) {
      switch (rng() % 16) {
        case 0:
        case 1:
        case 2:
        case 3:
        case 4: mine.adopt(fresh()); break;
        case 5: {  // other views of the same buffer see the same stamp
          if (mine.empty()) break;
          const stamped_buffer& o = mine[rng() % mine.size()];
          if (o.a.size() % 2 == 0) {
            auto m = o.a.reshape({2, o.a.size() / 2});
            check(m.data() == o.a.data(), "reshape moved the data");
          }
          auto words = o.a.reinterpret<std::uint32_t>();
          check(words.size() == 2 * o.a.size() && !first_foreign_byte(words.data(), words.bytes(), o.stamp),
                "reinterpret does not see the stamp");
          break;
        }
        case 6:
        case 7: {  // hand a buffer to another thread: a shared copy or the handle itself
          if (mine.empty()) break;
          std::lock_guard guard(box.mutex);
          if (box.items.size() >= mailbox::capacity) break;
          const std::size_t i = rng() % mine.size();
          if (rng() % 2 == 0) {
            box.items.adopt(mine[i]);
            out.shared += 1;
          } else {
            box.items.adopt(mine.take(i));
          }
          out.handoffs += 1;
          break;
        }
        case 8: {  // adopt one from another thread
          stamped_buffer o;
          {
            std::lock_guard guard(box.mutex);
            if (box.items.empty()) break;
            o = box.items.take(box.items.size() - 1);
          }
          check(o.intact(), "a buffer handed between threads lost its stamp");
          mine.adopt(std::move(o));
          break;
        }
        case 9: {  // give one back early; the handle must then refuse access
          if (mine.empty()) break;
          stamped_buffer o = mine.take(rng() % mine.size());
          check(o.intact(), "a buffer lost its stamp before unsafe_free");
          o.a.unsafe_free();
          out.unsafe_frees += 1;
          try {
            (void)o.a.data();
            check(false, "data() after unsafe_free did not throw");
          } catch (const use_after_free&) {
            out.use_after_free_seen += 1;
          }
          break;
        }
        case 10: {  // a nested scope on the same cache; some results outlive it
          scope inner(cache);
          stamped_buffer x = fresh();
          stamped_buffer y = fresh();
          check(x.intact() && y.intact(), "fresh buffers in a nested scope alias");
          if (rng() % 2 == 0) mine.adopt(std::move(x));
          break;
        }
        case 11: {  // uncached: straight to the backend
          uncached_guard g;
          stamped_buffer x = fresh();
          check(x.intact(), "an uncached buffer lost its stamp");
          if (rng() % 4 == 0) mine.adopt(std::move(x));
          break;
        }
        default: drop_one();
      }
      if (mine.size() > 24) drop_one();
    }
    if (rng() % 4 == 0) {  // some buffers escape the scope, most do not
      while (mine.size() > 4) drop_one();
      out.escapes_kept += mine.size();
    } else {
      while (!mine.empty()) drop_one();
    }
  }
  while (!mine.empty()) drop_one();
  out.ops = op;
}

// Reclaims, changes the idle limit and reads stats while the workers run.
void reclaimer(alloc_cache& cache, const std::atomic<bool>& done, counts& out) {
  std::mt19937_64 rng(42);
  const std::size_t limits[] = {cache_options::unlimited, cache_options::unlimited, 0, 4096, 65536, 1 << 20};
  while (!done.load()) {
    switch (rng() % 3) {
      case 0: cache.reclaim(rng() % 2 == 0 ? 0 : 16384); break;
      case 1: cache.set_max_idle_bytes(limits[rng() % std::size(limits)]); break;
      default: {
        const cache_stats st = cache.stats();
        check(st.backend_allocations >= st.backend_frees, "more backend frees than allocations");
      }
    }
    out.reclaimer_ops += 1;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  cache.set_max_idle_bytes(cache_options::unlimited);
}

}  // namespace

int main(int argc, char** argv) {
  const refpool::test::stress_args args =
      refpool::test::parse_stress_args(argc, argv, {16, 1000000}, "REFPOOL_STRESS_OPS");
  const int thread_count = args.threads;
  const std::uint64_t ops = args.ops;
  const auto start = std::chrono::steady_clock::now();
  const backend be = make_host_backend();
  std::vector<counts> per_thread(static_cast<std::size_t>(thread_count) + 1);
  cache_stats st;
  mailbox box;
  {
    alloc_cache cache{cache_options{}};
    std::atomic<bool> done{false};
    std::thread reclaim_thread(reclaimer, std::ref(cache), std::cref(done), std::ref(per_thread.back()));
    std::vector<std::thread> threads;
    for (int t = 0; t < thread_count; ++t)
      threads.emplace_back(worker, std::ref(cache), std::cref(be), std::ref(box), t, ops,
                           std::ref(per_thread[static_cast<std::size_t>(t)]));
    for (auto& t : threads) t.join();
    done.store(true);
    reclaim_thread.join();
    check(box.items.check_all(), "a buffer left in the mailbox lost its stamp");
    box.items.clear();
    st = cache.stats();
    check(st.live_blocks == 0 && st.live_bytes == 0, "live blocks remain after every handle went");
    check(st.held_bytes == st.idle_bytes, "held bytes are not idle bytes once nothing is live");
    check(st.held_bytes == be.outstanding_bytes(), "the backend has bytes out that the cache does not hold");
    check(st.backend_allocations - st.backend_frees == st.idle_blocks, "block counts disagree");
    check(st.hits > 0, "no hits at all");
  }
  check(be.outstanding_bytes() == 0, "bytes leaked after the cache was destroyed");
  counts sum;
  for (const counts& c : per_thread) {
    sum.ops += c.ops;
    sum.allocations += c.allocations;
    sum.handoffs += c.handoffs;
    sum.shared += c.shared;
    sum.unsafe_frees += c.unsafe_frees;
    sum.use_after_free_seen += c.use_after_free_seen;
    sum.escapes_kept += c.escapes_kept;
    sum.reclaimer_ops += c.reclaimer_ops;
  }
  check(sum.ops == ops * static_cast<std::uint64_t>(thread_count), "a worker did not finish its operations");
  check(sum.use_after_free_seen == sum.unsafe_frees, "an access after unsafe_free did not throw");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(
      "stress: {} threads x {} operations = {} in {:.2f} s; {} allocations (hits {}, misses {}, steals {}), "
      "{} handoffs ({} shared), {} unsafe frees, {} escapes, {} evictions, {} reclaimed; reclaimer: {} "
      "operations; {} failures\n",
      thread_count, ops, sum.ops, seconds, sum.allocations, st.hits, st.misses, st.steals, sum.handoffs, sum.shared,
      sum.unsafe_frees, st.escapes, st.evictions, st.reclaimed_blocks, sum.reclaimer_ops, failures.load());
  return failures.load() == 0 ? 0 : 1;
}
