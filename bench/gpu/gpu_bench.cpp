// GPU allocation benchmarks: refpool against the allocators people use instead, side by side
// in one run on one GPU. Usage: gpu_bench [--json FILE] [WORKLOAD...]; workloads: hit_path,
// reshape, training, random, threads (all when none is named). Prints tables, writes JSON.
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "workloads.hpp"

using namespace refpool::bench;
using refpool::cache_options;
using refpool::rounding_policy;

namespace {

std::string optional_text(const std::optional<std::uint64_t>& v) { return v ? fmt::format("{}", *v) : "n/a"; }
std::string optional_bytes(const std::optional<std::size_t>& v) {
  return v ? fmt::format("{:.1f} MiB", static_cast<double>(*v) / (1 << 20)) : "n/a";
}
json json_optional(const std::optional<std::uint64_t>& v) { return v ? json(*v) : json(nullptr); }

// The cheapest of several repeated allocations is slow for the raw driver: fewer operations there.
template <class A>
std::size_t scaled(std::size_t ops, std::size_t bytes = 0) {
  if constexpr (std::is_same_v<A, driver_allocator>)
    return std::max<std::size_t>(ops / (bytes >= (32u << 20) ? 2000 : 200), 50);
  return ops;
}

struct runner {
  refpool::cuda::stream stream{0};
  CUstream s() const { return static_cast<CUstream>(stream.ref().handle); }
  json_rows json;

  void hit_path() {
    fmt::print("\n== hit path: alloc + free of one size, steady state (ns per pair, median of 11) ==\n");
    const std::vector<std::size_t> sizes{256, 64u << 10, 1u << 20, 64u << 20};
    std::map<std::string, std::vector<double>> rows;
    std::vector<std::string> order;
    const auto measure = [&](auto& a) {
      using A = std::decay_t<decltype(a)>;
      order.push_back(a.name());
      for (std::size_t bytes : sizes) {
        const double ns = refpool::bench::hit_path(a, bytes, scaled<A>(200000, bytes), s());
        rows[a.name()].push_back(ns);
        const auto c = a.report();
        json.add({{"workload", "hit_path"},
                  {"allocator", a.name()},
                  {"bytes", bytes},
                  {"ns_per_pair", ns},
                  {"driver_allocations", json_optional(c.driver_allocations)},
                  {"hits", json_optional(c.hits)}});
      }
    };
    // "refpool": the default, pieces of segments on device memory. "refpool blocks": plain blocks;
    // segments change only the miss path, so a hit should cost the same. Both are measured again
    // after the anchors, so that the order of the rows cannot explain a difference between them.
    const auto blocks = [&](const char* label) {
      cache_options o;
      o.segments = refpool::segment_policy::off;
      refpool_allocator a(o, label);
      measure(a);
    };
    const auto pieces = [&](const char* label) {
      refpool_allocator a({}, label);
      measure(a);
    };
    for_each_allocator(measure);
    blocks("refpool blocks");
    pieces("refpool again");
    blocks("blocks again");
    fmt::print("{:<16}", "allocator");
    for (std::size_t b : sizes) fmt::print(" {:>14}", fmt::format("{} B", b));
    fmt::print("\n");
    const auto& ours = rows["refpool"];
    for (const auto& name : order) {
      fmt::print("{:<16}", name);
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const double ns = rows[name][i];
        fmt::print(" {:>14}",
                   name == "refpool" ? fmt::format("{:.1f}", ns) : fmt::format("{:.0f} ({:.0f}x)", ns, ns / ours[i]));
      }
      fmt::print("\n");
    }
  }

  void reshape() {
    fmt::print("\n== reshape reuse: 10 requests an iteration, equal byte sizes in rotating shapes and types ==\n");
    fmt::print("{:<16} {:>12} {:>10} {:>8} {:>8} {:>18}\n", "allocator", "ns/request", "vs refpool", "hits", "misses",
               "driver allocations");
    double ours = 0;
    for_each_allocator([&](auto& a) {
      using A = std::decay_t<decltype(a)>;
      const int iterations = static_cast<int>(scaled<A>(20000, 4u << 20));
      const auto [ns, requests] = reshape_reuse(a, iterations, s());
      if (a.name() == "refpool") ours = ns;
      const auto c = a.report();
      fmt::print("{:<16} {:>12.1f} {:>9.1f}x {:>8} {:>8} {:>18}\n", a.name(), ns, ns / ours, optional_text(c.hits),
                 optional_text(c.misses), optional_text(c.driver_allocations));
      json.add({{"workload", "reshape"},
                {"allocator", a.name()},
                {"iterations", iterations},
                {"requests_per_iteration", requests},
                {"ns_per_request", ns},
                {"hits", json_optional(c.hits)},
                {"misses", json_optional(c.misses)},
                {"driver_allocations", json_optional(c.driver_allocations)}});
    });
  }

  void training() {
    fmt::print("\n== training-step trace: MLP 1024-4096-4096-1024, batch 128, 15 requests a step ==\n");
    fmt::print("{:<16} {:>10} {:>12} {:>10} {:>22} {:>16} {:>14}\n", "allocator", "iterations", "us/iteration",
               "vs refpool", "steady driver allocs", "device MiB max", "min..max MiB");
    double ours = 0;
    for_each_allocator([&](auto& a) {
      using A = std::decay_t<decltype(a)>;
      const int iterations = static_cast<int>(scaled<A>(10000, 64u << 20) < 1000 ? 1000 : scaled<A>(10000, 64u << 20));
      const auto r = training_trace(a, iterations, 100, s());
      if (a.name() == "refpool") ours = r.us_per_iteration;
      const auto [lo, hi] = std::minmax_element(r.used_bytes.begin(), r.used_bytes.end());
      const double mib = 1 << 20;
      fmt::print("{:<16} {:>10} {:>12.2f} {:>9.1f}x {:>22} {:>16.1f} {:>14}\n", a.name(), iterations,
                 r.us_per_iteration, r.us_per_iteration / ours,
                 r.driver_count_known ? fmt::format("{}", r.steady_driver_allocations) : "n/a",
                 r.used_bytes.empty() ? 0.0 : *hi / mib,
                 r.used_bytes.empty() ? "-" : fmt::format("{:.0f}..{:.0f}", *lo / mib, *hi / mib));
      json.add({{"workload", "training"},
                {"allocator", a.name()},
                {"iterations", iterations},
                {"us_per_iteration", r.us_per_iteration},
                {"steady_driver_allocations",
                 r.driver_count_known ? refpool::bench::json(r.steady_driver_allocations) : refpool::bench::json()},
                {"used_bytes_every_100", r.used_bytes}});
    });
  }

  template <class A>
  void random_row(A& a, std::size_t max_bytes, int ops, double& ours) {
    const auto r = random_allocations(a, max_bytes, ops, std::size_t{8} << 30, s());
    const auto c = a.report();
    if (ours == 0) ours = r.ns_per_op;
    const double held_ratio =
        c.peak_reserved_bytes ? static_cast<double>(*c.peak_reserved_bytes) / r.peak_live_bytes : 0;
    const std::string hit_rate =
        c.hits ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(*c.hits) / static_cast<double>(*c.hits + *c.misses))
               : "n/a";
    fmt::print("{:<18} {:>10} {:>10.0f} {:>9.1f}x {:>10} {:>14} {:>12}\n", a.name(),
               fmt::format("{} MiB", max_bytes >> 20), r.ns_per_op, r.ns_per_op / ours, hit_rate,
               optional_bytes(c.peak_reserved_bytes),
               c.peak_reserved_bytes ? fmt::format("{:.2f}x", held_ratio) : "n/a");
    json.add({{"workload", "random"},
              {"allocator", a.name()},
              {"max_bytes", max_bytes},
              {"ops", ops},
              {"ns_per_op", r.ns_per_op},
              {"hits", json_optional(c.hits)},
              {"misses", json_optional(c.misses)},
              {"peak_live_bytes", r.peak_live_bytes},
              {"peak_reserved_bytes", json_optional(c.peak_reserved_bytes)}});
  }

  void random() {
    fmt::print("\n== random allocations (RMM-style: uniform sizes, 73% allocations, random free order) ==\n");
    fmt::print("{:<18} {:>10} {:>10} {:>10} {:>10} {:>14} {:>12}\n", "allocator", "max size", "ns/op", "vs refpool",
               "hit rate", "peak held", "held/live");
    for (std::size_t max_bytes : {std::size_t{1} << 20, std::size_t{64} << 20}) {
      const int ops = 20000;
      double ours = 0;
      {
        cache_options o;
        o.segments = refpool::segment_policy::off;
        refpool_allocator a(o, "refpool exact");
        random_row(a, max_bytes, ops, ours);
      }
      for (unsigned divisions : {4u, 1u}) {
        cache_options o;
        o.rounding = rounding_policy::pow2(divisions);
        o.segments = refpool::segment_policy::off;
        refpool_allocator a(o, fmt::format("refpool pow2:{}", divisions));
        random_row(a, max_bytes, ops, ours);
      }
      {  // pieces carved from segments grown through the driver's virtual memory (the default for device memory)
        cache_options o;
        o.segments = refpool::segment_policy::on;
        refpool_allocator a(o, "refpool segments");
        random_row(a, max_bytes, ops, ours);
      }
      {
        driver_allocator a;
        random_row(a, max_bytes, ops / 10, ours);
      }
      {
        async_pool_allocator a;
        random_row(a, max_bytes, ops, ours);
      }
#if REFPOOL_BENCH_CUB
      {
        cub_allocator a;
        random_row(a, max_bytes, ops, ours);
      }
#endif
#if REFPOOL_BENCH_TORCH
      {
        torch_allocator a;
        random_row(a, max_bytes, ops, ours);
      }
#endif
    }
  }

  void threads() {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    fmt::print("\n== threads: each thread its own scope (refpool) and stream; alloc + free of 64 KiB ==\n");
    fmt::print("{:<16} {:>8} {:>16} {:>18}\n", "allocator", "threads", "Mpairs/s total", "x 1-thread rate");
    for_each_allocator([&](auto& a) {
      using A = std::decay_t<decltype(a)>;
      double single = 0;
      for (int t : {1, 2, 4, 8, 16}) {
        if (static_cast<unsigned>(t) > cores) break;
        const std::size_t pairs = is_refpool<A> ? 1000000 : scaled<A>(20000);  // anchors serialise: keep runs short
        const double rate = threaded_pairs(a, t, 64u << 10, pairs);
        if (t == 1) single = rate;
        fmt::print("{:<16} {:>8} {:>16.2f} {:>17.1f}x\n", a.name(), t, rate / 1e6, rate / single);
        json.add({{"workload", "threads"}, {"allocator", a.name()}, {"threads", t}, {"pairs_per_second", rate}});
      }
    });
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "gpu_bench.json";
  std::vector<std::string> workloads;
  CLI::App app{"refpool's GPU allocation benchmarks against the driver's allocators, CUB and PyTorch"};
  app.add_option("--json", json_path, "Write the rows to this file")->capture_default_str();
  app.add_option("workload", workloads, "Run only these (default: all)")
      ->check(CLI::IsMember({"hit_path", "reshape", "training", "random", "threads"}));
  CLI11_PARSE(app, argc, argv);
  const std::set<std::string> chosen(workloads.begin(), workloads.end());
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash must not swallow the lines before it
  if (!refpool::cuda::available()) {
    fmt::print("gpu_bench needs a CUDA device: {}\n", refpool::cuda::unavailable_reason());
    return 77;
  }
  const auto want = [&](const char* name) { return chosen.empty() || chosen.count(name) != 0; };
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  fmt::print("refpool GPU benchmarks on {} (CUDA driver {}), {}\n", refpool::cuda::device_name(0),
             refpool::cuda::driver_version(), date);
  fmt::print("anchors built in: cuMemAlloc, cuMemAllocAsync{}{}\n", REFPOOL_BENCH_CUB ? ", CUB" : " (CUB: not built)",
             REFPOOL_BENCH_TORCH ? ", PyTorch c10" : " (PyTorch: not built)");
  use_device_0();
  runner r;
  r.json.add({{"workload", "machine"},
              {"gpu", refpool::cuda::device_name(0)},
              {"driver", refpool::cuda::driver_version()},
              {"date", date}});
  if (want("hit_path")) r.hit_path();
  if (want("reshape")) r.reshape();
  if (want("training")) r.training();
  if (want("random")) r.random();
  if (want("threads")) r.threads();
  if (!r.json.write(json_path)) fmt::print(stderr, "cannot write {}\n", json_path);
  fmt::print("\nJSON: {}\n", json_path);
  return 0;
}
