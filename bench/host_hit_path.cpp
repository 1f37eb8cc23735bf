// Host hit path: alloc + free of one size inside a scope, steady state, 1..N threads, side by
// side with the same loop through malloc/free and through a mutex-guarded size-keyed cache (the
// design ANCHORS.md measured); also a cache-level request freed by pointer (what a framework
// allocator hook does). Prints a table and writes JSON (argv[1], default host_hit_path.json).
// `host_hit_path --pairs N [handle|pointer|cache-level]`: just N pairs of one kind on one thread,
// for instruction counts under callgrind.
#include <cstdlib>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <refpool/refpool.hpp>

#include <string_view>

#include "timing.hpp"

namespace {

using refpool::bench::keep;
using refpool::bench::median_ns_per_op;

// The baseline: one mutex around a map from byte size to free pointers.
class mutex_cache {
 public:
  void* get(std::size_t bytes) {
    std::lock_guard guard(mutex_);
    auto& list = free_[bytes];
    if (list.empty()) return std::malloc(bytes);
    void* p = list.back();
    list.pop_back();
    return p;
  }
  void put(void* p, std::size_t bytes) {
    std::lock_guard guard(mutex_);
    free_[bytes].push_back(p);
  }
  ~mutex_cache() {
    for (auto& [bytes, list] : free_)
      for (void* p : list) std::free(p);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
};

// Runs `per_thread(ops)` on `threads` threads at once; returns median ns per op per thread.
template <class PerThread>
double threaded(int threads, std::size_t ops, PerThread per_thread) {
  return median_ns_per_op(
      [&](std::size_t n) {
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) pool.emplace_back([&] { per_thread(n); });
        for (auto& t : pool) t.join();
      },
      ops, 11);
}

}  // namespace

/// N alloc+free pairs of 256 B on this thread: `handle` (a scope, a data_ref), `cache-level`
/// (alloc_cache::allocate, a data_ref), `pointer` (cache-level, freed by pointer).
int pairs_only(std::size_t n, std::string_view kind) {
  const refpool::backend be = refpool::host_backend();
  refpool::alloc_cache cache{refpool::cache_options{}};
  refpool::scope s(cache);
  for (std::size_t i = 0; i < n; ++i) {
    if (kind == "pointer") {
      void* p = refpool::to_pointer(cache.allocate(be, 256));
      keep(p);
      refpool::free_pointer(p);
    } else if (kind == "cache-level") {
      refpool::data_ref r = cache.allocate(be, 256);
      keep(r.data());
    } else {
      refpool::data_ref r = refpool::allocate(be, 256);
      keep(r.data());
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  std::string json_path = "host_hit_path.json";
  std::vector<std::string> pairs;
  CLI::App app{"refpool's host hit path against malloc and a mutex-guarded map, by size and threads"};
  app.add_option("json", json_path, "Write the rows to this file")->capture_default_str();
  app.add_option("--pairs", pairs, "Only N pairs of 256 B on this thread, of KIND handle, cache-level or pointer")
      ->expected(1, 2)
      ->type_name("N [KIND]");
  CLI11_PARSE(app, argc, argv);
  if (!pairs.empty()) return pairs_only(std::stoull(pairs[0]), pairs.size() > 1 ? pairs[1] : "handle");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<int> thread_counts{1};
  for (int t = 2; t <= static_cast<int>(cores) && t <= 16; t *= 2) thread_counts.push_back(t);
  const refpool::backend be = refpool::host_backend();
  refpool::alloc_cache cache{refpool::cache_options{}};
  mutex_cache baseline;
  refpool::bench::json_rows json;

  fmt::print("host hit path: one alloc + free pair of one size, ns per pair (median), per thread\n");
  fmt::print("{:>8} {:>7} | {:>12} {:>12} {:>12} {:>10} {:>10} | {:>12}\n", "bytes", "threads", "refpool",
             "refpool arr", "refpool ptr", "malloc", "mutex map", "mutex/refpool");
  for (std::size_t bytes : {256ul, 65536ul, 1ul << 20}) {
    for (int threads : thread_counts) {
      const std::size_t ops = 200000;
      const double ours = threaded(threads, ops, [&](std::size_t n) {
        refpool::scope s(cache);
        for (std::size_t i = 0; i < n; ++i) {
          refpool::data_ref r = refpool::allocate(be, bytes);
          keep(r.data());
        }
      });
      const double arrays = threaded(threads, ops, [&](std::size_t n) {
        refpool::scope s(cache);
        for (std::size_t i = 0; i < n; ++i) {
          auto a = refpool::empty<float>(be, {bytes / 4});
          keep(a.data());
        }
      });
      const double by_pointer = threaded(threads, ops, [&](std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
          void* p = refpool::to_pointer(cache.allocate(be, bytes));
          keep(p);
          refpool::free_pointer(p);
        }
      });
      const double plain = threaded(threads, ops, [&](std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
          void* p = std::malloc(bytes);
          keep(p);
          std::free(p);
        }
      });
      const double locked = threaded(threads, ops, [&](std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
          void* p = baseline.get(bytes);
          keep(p);
          baseline.put(p, bytes);
        }
      });
      fmt::print("{:>8} {:>7} | {:>12.1f} {:>12.1f} {:>12.1f} {:>10.1f} {:>10.1f} | {:>11.1f}x\n", bytes, threads, ours,
                 arrays, by_pointer, plain, locked, locked / ours);
      json.add({{"workload", "host_hit_path"},
                {"bytes", bytes},
                {"threads", threads},
                {"refpool_ns", ours},
                {"refpool_array_ns", arrays},
                {"refpool_pointer_ns", by_pointer},
                {"malloc_ns", plain},
                {"mutex_map_ns", locked}});
    }
  }
  const auto st = cache.stats();
  fmt::print("\nrefpool cache: {} hits, {} misses ({:.4f}% hits)\n", st.hits, st.misses, 100.0 * st.hit_rate());
  if (!json.write(json_path)) fmt::print(stderr, "cannot write {}\n", json_path);
  return 0;
}
