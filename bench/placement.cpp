// Placement of plans (issue 35): for every step of the captured traces (bench/traces/*.csv.xz, one
// plan each) and for the step shapes of issue 35's reproduction (4 KiB requests whose lifetimes
// never overlap; all alive together), the library's placement side by side with the walk over
// every placed request it replaced for long runs (place_greedy_by_walk, which short runs still
// use): arena bytes (the packing), the peak of live bytes (the floor),
// whether the offsets are the same, and CPU time. White-box: it calls lib/plan/placement.
//
//   placement [--json FILE] TRACE.csv.xz...   (default placement.json)
//
// Prints a table and writes JSON.
#include <algorithm>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "plan/placement.hpp"
#include "timing.hpp"
#include "trace_file.hpp"

namespace {

using refpool::detail::lifetime;

// CPU milliseconds of `f`, the least of `repeats` runs.
template <class F>
double cpu_ms(F&& f, int repeats) {
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const std::clock_t start = std::clock();
    f();
    best = std::min(best, static_cast<double>(std::clock() - start) * 1e3 / CLOCKS_PER_SEC);
  }
  return best;
}

struct run_shape {
  std::string name;
  std::vector<std::size_t> sizes;
  std::vector<lifetime> lifetimes;
};

// One plan per step: request i allocated at position i, released at the count of requests
// allocated before its release, or alive to the end.
std::vector<run_shape> shapes_of(const std::string& path) {
  std::vector<run_shape> out;
  const auto steps = refpool::bench::read_trace(path);
  const std::string file = refpool::bench::trace_name(path);
  for (std::size_t s = 0; s < steps.size(); ++s) {
    run_shape r{fmt::format("{} step {}", file, s), {}, {}};
    std::map<std::size_t, std::size_t> request_of;
    for (const auto& e : steps[s]) {
      if (e.alloc) {
        request_of[e.index] = r.sizes.size();
        r.sizes.push_back(e.bytes);
        r.lifetimes.emplace_back(r.sizes.size() - 1, 0);
      } else {
        r.lifetimes[request_of.at(e.index)].second = r.sizes.size();
      }
    }
    const std::size_t n = r.sizes.size();
    for (std::size_t i = 0; i < n; ++i)
      r.lifetimes[i].second =
          r.lifetimes[i].second == 0 ? n + 1 : std::max<std::uint64_t>(r.lifetimes[i].second, i + 1);
    if (n != 0) out.push_back(std::move(r));
  }
  return out;
}

run_shape four_kib(std::size_t n, bool all_alive) {
  run_shape r{fmt::format("4 KiB x {}, {}", n, all_alive ? "all alive together" : "lifetimes never overlap"), {}, {}};
  r.sizes.assign(n, 4096);
  for (std::size_t i = 0; i < n; ++i) r.lifetimes.emplace_back(i, all_alive ? n + 1 : i + 1);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "placement.json";
  std::vector<std::string> traces;
  CLI::App app{"Placement of plans against the walk over every placed request it replaced"};
  app.add_option("--json", json_path, "Write the rows to this file")->capture_default_str();
  app.add_option("trace", traces, "Trace files (bench/traces/*.csv.xz, or a capture's .csv)")->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);
  std::vector<run_shape> shapes;
  for (const std::string& path : traces)
    for (auto& s : shapes_of(path)) shapes.push_back(std::move(s));
  for (const std::size_t n : {2000, 8000, 32000}) shapes.push_back(four_kib(n, false));
  for (const std::size_t n : {2000, 8000}) shapes.push_back(four_kib(n, true));
  fmt::print("{:<48} {:>8} {:>14} {:>14} {:>14} {:>6} {:>11} {:>11} {:>7}\n", "run", "requests", "peak live B",
             "arena walk B", "arena now B", "same", "walk ms", "now ms", "ratio");
  refpool::bench::json_rows rows;
  for (const run_shape& r : shapes) {
    const auto walked = refpool::detail::place_greedy_by_walk(r.sizes, r.lifetimes, 256);
    const auto now = refpool::detail::place_greedy_by_size(r.sizes, r.lifetimes, 256);
    const std::size_t peak = refpool::detail::peak_live_bytes(r.sizes, r.lifetimes);
    const int repeats = r.sizes.size() > 10000 ? 1 : 5;
    const double walk_ms =
        cpu_ms([&] { refpool::bench::keep(refpool::detail::place_greedy_by_walk(r.sizes, r.lifetimes, 256).second); },
               repeats);
    const double now_ms =
        cpu_ms([&] { refpool::bench::keep(refpool::detail::place_greedy_by_size(r.sizes, r.lifetimes, 256).second); },
               repeats);
    const bool same = walked == now;
    fmt::print("{:<48} {:>8} {:>14} {:>14} {:>14} {:>6} {:>11.2f} {:>11.2f} {:>6.2f}x\n", r.name, r.sizes.size(), peak,
               walked.second, now.second, same ? "yes" : "no", walk_ms, now_ms, now_ms > 0 ? walk_ms / now_ms : 0);
    rows.add({{"run", r.name},
              {"requests", r.sizes.size()},
              {"peak_live_bytes", peak},
              {"arena_walk_bytes", walked.second},
              {"arena_bytes", now.second},
              {"same_offsets", same},
              {"walk_ms", walk_ms},
              {"ms", now_ms}});
  }
  if (!rows.write(json_path)) {
    fmt::print(stderr, "cannot write {}\n", json_path);
    return 1;
  }
  fmt::print("JSON: {}\n", json_path);
  return 0;
}
