// Replays captured training-step allocation traces (bench/traces/*.csv: step,event,index,bytes)
// through refpool's plain cache and through a planned scope, on the host backend or a CUDA device,
// and reports memory held against peak live bytes, ns per request and driver calls in steady
// state. Usage: trace_replay [--cuda] [--iterations N] [--json FILE] [--only LABEL] TRACE.csv...
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <refpool/refpool.hpp>

#include "timing.hpp"

namespace {

struct event {
  bool alloc;
  std::size_t index;
  std::size_t bytes;
};
using step = std::vector<event>;

std::vector<step> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::string line;
  std::getline(in, line);  // header
  std::vector<step> steps;
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    std::string k, action, index, bytes;
    std::getline(fields, k, ',');
    std::getline(fields, action, ',');
    std::getline(fields, index, ',');
    std::getline(fields, bytes, ',');
    const std::size_t s = std::stoul(k);
    if (steps.size() <= s) steps.resize(s + 1);
    steps[s].push_back({action == "alloc", std::stoul(index), std::stoul(bytes)});
  }
  return steps;
}

std::size_t peak_live(const std::vector<step>& steps) {
  std::size_t peak = 0;
  for (const step& st : steps) {
    std::vector<std::size_t> size_of;
    std::size_t live = 0;
    for (const event& e : st) {
      if (e.alloc) {
        if (size_of.size() <= e.index) size_of.resize(e.index + 1);
        size_of[e.index] = e.bytes;
        live += e.bytes;
        peak = std::max(peak, live);
      } else {
        live -= size_of[e.index];
      }
    }
  }
  return peak;
}

struct result {
  double ns_per_request = 0;
  std::size_t held_bytes = 0;  ///< backend bytes outstanding after the last iteration
  std::uint64_t steady_driver_allocations = 0;
  refpool::cache_stats stats;
};

// One configuration: `planned` uses a planned scope, else a plain one with `options`.
result replay(const refpool::backend& be, const std::vector<step>& steps, int iterations, refpool::cache_options options,
              bool planned) {
  result out;
  {
    refpool::alloc_cache cache{options};
    std::vector<refpool::data_ref> live;
    std::size_t requests = 0;
    double seconds = 0;
    std::uint64_t allocations_at_steady = 0;
    const int warmup = static_cast<int>(2 * steps.size());  // every sequence seen twice
    for (int it = 0; it < iterations; ++it) {
      const step& st = steps[static_cast<std::size_t>(it) % steps.size()];
      if (it == warmup) allocations_at_steady = be.allocation_count() + cache.stats().segment_grows;
      const auto start = std::chrono::steady_clock::now();
      {
        refpool::scope s(cache, {.plan = planned ? "trace" : ""});
        for (const event& e : st) {
          if (e.alloc) {
            if (live.size() <= e.index) live.resize(e.index + 1);
            live[e.index] = refpool::allocate(be, e.bytes);
          } else {
            live[e.index].reset();
          }
        }
        for (auto& r : live) r.reset();  // what the step did not free goes at its end
      }
      if (it >= warmup) {
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        requests += st.size();
      }
    }
    out.ns_per_request = seconds * 1e9 / static_cast<double>(std::max<std::size_t>(requests, 1));
    out.stats = cache.stats();
    // Driver calls: block allocations and calls that grew segments (commits, segment allocations).
    out.steady_driver_allocations = be.allocation_count() + out.stats.segment_grows - allocations_at_steady;
    out.held_bytes = be.outstanding_bytes();
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool use_cuda = false;
  int iterations = 60;
  std::string json_path = "trace_replay.json";
  std::string only;  // one configuration's label, e.g. "cache segments"
  std::vector<std::string> traces;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cuda") == 0) {
      use_cuda = true;
    } else if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = std::stoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      traces.emplace_back(argv[i]);
    }
  }
  if (use_cuda && !refpool::cuda::available()) {
    fmt::print("--cuda needs a CUDA device: {}\n", refpool::cuda::unavailable_reason());
    return 77;
  }
  refpool::bench::json_rows json;
  fmt::print("{:<14} {:<14} {:>8} {:>12} {:>12} {:>10} {:>10} {:>14} {:>10}\n", "trace", "refpool", "requests",
             "peak live", "held", "held/live", "ns/req", "steady allocs", "plan hits");
  for (const std::string& path : traces) {
    const auto steps = read_trace(path);
    const std::size_t live = peak_live(steps);
    std::size_t requests = 0;
    for (const auto& st : steps)
      for (const auto& e : st) requests += e.alloc;
    const std::string name = path.substr(path.find_last_of('/') + 1);
    struct config {
      const char* label;
      refpool::cache_options options;
      bool planned;
    };
    // Segments explicitly off except in the segments row: the default (automatic) carves pieces
    // for device memory, so --cuda would otherwise measure segments in every row.
    refpool::cache_options exact;
    exact.segments = refpool::segment_policy::off;
    refpool::cache_options pow2 = exact;
    pow2.rounding = refpool::rounding_policy::pow2(4);
    refpool::cache_options segments;
    segments.segments = refpool::segment_policy::on;
    for (const config& c : {config{"cache exact", exact, false}, config{"cache pow2:4", pow2, false},
                            config{"cache segments", segments, false}, config{"planned", exact, true}}) {
      if (!only.empty() && c.label != only) continue;
      // A fresh backend per run, so its counters describe this run alone.
      const refpool::backend be = use_cuda ? refpool::cuda::device(0) : refpool::make_host_backend();
      const std::size_t before = be.outstanding_bytes();
      const result r = replay(be, steps, iterations, c.options, c.planned);
      const std::size_t held = r.held_bytes - std::min(before, r.held_bytes);
      fmt::print("{:<14} {:<14} {:>8} {:>10.1f}MB {:>10.1f}MB {:>9.3f}x {:>10.1f} {:>14} {:>10}\n", name, c.label,
                 requests / steps.size(), live / 1e6, held / 1e6, static_cast<double>(held) / live, r.ns_per_request,
                 r.steady_driver_allocations, r.stats.plan_hits);
      json.add(fmt::format(R"({{"trace": "{}", "config": "{}", "backend": "{}", "steps": {}, "peak_live_bytes": {}, )"
                           R"("held_bytes": {}, "ns_per_request": {:.1f}, "steady_driver_allocations": {}, )"
                           R"("plan_hits": {}, "plan_misses": {}, "arena_bytes": {}, "peak_reserved_bytes": {}, )"
                           R"("segment_grows": {}, "hits": {}, "misses": {}}})",
                           name, c.label, use_cuda ? "cuda" : "host", steps.size(), live, held, r.ns_per_request,
                           r.steady_driver_allocations, r.stats.plan_hits, r.stats.plan_misses, r.stats.arena_bytes,
                           r.stats.peak_reserved_bytes, r.stats.segment_grows, r.stats.hits, r.stats.misses));
    }
  }
  json.write(json_path);
  return 0;
}
