// The per-request statistics of refpool's PyTorch hooks (python/refpool/_torch_hooks_counters.hpp:
// one device's counters behind an uncontended mutex) side by side with the lock-free alternative
// (kept below as `atomic_counters`: a relaxed atomic add per counter, peaks exact through the
// value each add returns and a compare-and-swap loop): a request counted at allocation and at free,
// sizes mixing PyTorch's small and large pools, on 1..N threads sharing one device's counters.
// Prints a table of ns per request (alloc + free) and, with --instructions, the instructions per
// request under callgrind (exact and independent of the machine's load, but blind to what an
// atomic read-modify-write costs); writes JSON (--json). Both variants' counts are checked equal
// before anything is timed.
//   torch_hook_counters [--json PATH] [--threads N] [--instructions]
//   torch_hook_counters --pairs N --variant mutex|atomic   (N requests of one variant, for callgrind)
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

#include "../python/refpool/_torch_hooks_counters.hpp"
#include "timing.hpp"

namespace {

using refpool::bench::json;
using refpool::bench::keep;
using refpool::bench::median_ns_per_op;
using refpool_torch::device_counters;

// The lock-free alternative: 15 relaxed atomic adds per request (current of the pool and of `all`
// and the pool's total, for each of the five kinds; `all`'s totals are the pools' sums when read).
// Frees here are never deferred: active moves with allocation.
class atomic_counters {
 public:
  std::int64_t on_alloc(std::size_t size) { return change(size, +1); }
  std::int64_t on_free(std::size_t size) { return change(size, -1); }
  int read(std::int64_t* out, int capacity) {
    int n = 0;
    const auto put = [&](std::int64_t v) {
      if (n < capacity) out[n++] = v;
    };
    for (int k = 0; k < device_counters::kinds; ++k)
      for (int c = 0; c < device_counters::classes; ++c) {
        put(load(current_[k][c]));
        put(load(peak_[k][c]));
        for (int w = 0; w < 2; ++w)
          put(c == device_counters::all_classes ? load(totals_[k][0][w]) + load(totals_[k][1][w])
                                                : load(totals_[k][c - 1][w]));
      }
    put(0);  // num_ooms
    return n;
  }

 private:
  using counter = std::atomic<std::int64_t>;
  static std::int64_t load(const counter& c) { return c.load(std::memory_order_relaxed); }
  std::int64_t add(int k, int c, std::int64_t delta) {
    const std::int64_t now = current_[k][c].fetch_add(delta, std::memory_order_relaxed) + delta;
    std::int64_t seen = peak_[k][c].load(std::memory_order_relaxed);
    while (now > seen && !peak_[k][c].compare_exchange_weak(seen, now, std::memory_order_relaxed)) {}
    return now;
  }
  std::int64_t change(std::size_t size, int sign) {
    const int pool = size <= device_counters::small_size ? 1 : 2;
    const auto block = static_cast<std::int64_t>((size + device_counters::block_granule - 1) /
                                                 device_counters::block_granule * device_counters::block_granule);
    std::int64_t amounts[device_counters::kinds] = {};
    amounts[device_counters::allocation] = amounts[device_counters::active] = 1;
    amounts[device_counters::allocated_bytes] = amounts[device_counters::active_bytes] = block;
    amounts[device_counters::requested_bytes] = static_cast<std::int64_t>(size);
    std::int64_t allocated_now = 0;
    for (int k = 0; k < device_counters::kinds; ++k) {
      add(k, pool, sign * amounts[k]);
      const std::int64_t all = add(k, device_counters::all_classes, sign * amounts[k]);
      if (k == device_counters::allocated_bytes) allocated_now = all;
      totals_[k][pool - 1][sign > 0 ? 0 : 1].fetch_add(amounts[k], std::memory_order_relaxed);
    }
    return allocated_now;
  }

  counter current_[device_counters::kinds][device_counters::classes]{};
  counter peak_[device_counters::kinds][device_counters::classes]{};
  counter totals_[device_counters::kinds][2][2]{};  // [kind][small, large][allocated, freed]
};

// Request sizes: a mix of PyTorch's small pool (up to 1 MiB) and large pool, as a model's tensors.
std::vector<std::size_t> request_sizes() {
  std::vector<std::size_t> sizes;
  std::uint64_t x = 88172645463325252ULL;
  for (int i = 0; i < 256; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    sizes.push_back(i % 3 == 0 ? 1 + x % (std::size_t{64} << 20) : 1 + x % (std::size_t{1} << 20));
  }
  return sizes;
}

// `requests` requests: each counted at allocation, and at free 8 requests later.
template <class Counters>
void count(Counters& counters, const std::vector<std::size_t>& sizes, std::size_t requests) {
  constexpr std::size_t lag = 8;
  for (std::size_t i = 0; i < requests + lag; ++i) {
    if (i < requests) keep(counters.on_alloc(sizes[i % sizes.size()]));
    if (i >= lag) keep(counters.on_free(sizes[(i - lag) % sizes.size()]));
  }
}

template <class Counters>
double ns_per_request(int threads, const std::vector<std::size_t>& sizes) {
  Counters counters;
  return median_ns_per_op(
      [&](std::size_t n) {
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) pool.emplace_back([&] { count(counters, sizes, n); });
        for (auto& t : pool) t.join();
      },
      200000, 15);
}

// Both variants count the same requests to the same values (threads included).
bool same_counts(const std::vector<std::size_t>& sizes, int threads) {
  device_counters shipped;
  atomic_counters lock_free;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      count(shipped, sizes, 10000);
      count(lock_free, sizes, 10000);
    });
  for (auto& t : pool) t.join();
  std::int64_t a[device_counters::values], b[device_counters::values];
  shipped.read(a, device_counters::values);
  lock_free.read(b, device_counters::values);
  for (int i = 0; i < device_counters::values; ++i)
    if ((i % device_counters::fields) != device_counters::peak && a[i] != b[i]) {  // peaks depend on the interleaving
      std::fprintf(stderr, "counter %d differs: mutex %lld, atomic %lld\n", i, static_cast<long long>(a[i]),
                   static_cast<long long>(b[i]));
      return false;
    }
  return true;
}

// N requests of one variant on this thread, inside callgrind's instrumentation.
int run_pairs(std::size_t pairs, const std::string& variant) {
  const auto sizes = request_sizes();
  device_counters shipped;
  atomic_counters lock_free;
  count(shipped, sizes, 1000);  // warm: first touches outside the count
  count(lock_free, sizes, 1000);
  CALLGRIND_START_INSTRUMENTATION;
  if (variant == "mutex")
    count(shipped, sizes, pairs);
  else
    count(lock_free, sizes, pairs);
  CALLGRIND_STOP_INSTRUMENTATION;
  return 0;
}

// Instructions per request of one variant: this program run again under callgrind.
double instructions_per_request(const char* self, const std::string& variant, std::size_t pairs) {
  const std::string command = fmt::format(
      "valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null '{}' --pairs {} --variant {} 2>&1",
      self, pairs, variant);
  FILE* out = popen(command.c_str(), "r");
  if (out == nullptr) return -1;
  char line[512];
  double collected = -1;
  while (std::fgets(line, sizeof line, out) != nullptr) {
    const std::string text = line;
    if (const auto at = text.find("Collected :"); at != std::string::npos)
      collected = std::strtod(text.c_str() + at + 11, nullptr);
  }
  if (pclose(out) != 0) return -1;
  return collected / static_cast<double>(pairs);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"refpool's PyTorch hook counters: the mutex against relaxed atomic adds"};
  std::string json_path = "torch_hook_counters.json";
  int max_threads = 2;
  bool instructions = false;
  std::size_t pairs = 0;
  std::string variant = "atomic";
  app.add_option("--json", json_path, "where to write the JSON rows");
  app.add_option("--threads", max_threads, "up to this many threads share one device's counters")
      ->check(CLI::Range(1, 64));
  app.add_flag("--instructions", instructions, "also count instructions per request under callgrind (valgrind)");
  app.add_option("--pairs", pairs, "only count this many requests of --variant (for callgrind)");
  app.add_option("--variant", variant, "mutex or atomic")->check(CLI::IsMember({"mutex", "atomic"}));
  CLI11_PARSE(app, argc, argv);
  if (pairs > 0) return run_pairs(pairs, variant);

  const auto sizes = request_sizes();
  for (int threads = 1; threads <= max_threads; ++threads)
    if (!same_counts(sizes, threads)) return 1;
  refpool::bench::json_rows rows;
  fmt::print("{:<28} {:>8} {:>14} {:>14} {:>8}\n", "request (alloc + free)", "threads", "mutex ns", "atomic ns",
             "ratio");
  for (int threads = 1; threads <= max_threads; ++threads) {
    const double mutex = ns_per_request<device_counters>(threads, sizes);
    const double atomic = ns_per_request<atomic_counters>(threads, sizes);
    fmt::print("{:<28} {:>8} {:>14.1f} {:>14.1f} {:>8.2f}\n", "time per request", threads, mutex, atomic,
               atomic / mutex);
    rows.add(json{{"measure", "ns per request"},
                  {"threads", threads},
                  {"mutex", mutex},
                  {"atomic", atomic},
                  {"atomic_over_mutex", atomic / mutex}});
  }
  if (instructions) {
    const double mutex = instructions_per_request(argv[0], "mutex", 100000);
    const double atomic = instructions_per_request(argv[0], "atomic", 100000);
    fmt::print("{:<28} {:>8} {:>14.1f} {:>14.1f} {:>8.2f}\n", "instructions per request", 1, mutex, atomic,
               atomic / mutex);
    rows.add(json{{"measure", "instructions per request (callgrind)"},
                  {"threads", 1},
                  {"mutex", mutex},
                  {"atomic", atomic},
                  {"atomic_over_mutex", atomic / mutex}});
  }
  if (!rows.write(json_path)) {
    fmt::print(stderr, "cannot write {}\n", json_path);
    return 1;
  }
  return 0;
}
