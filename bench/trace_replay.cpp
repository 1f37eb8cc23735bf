// Replays captured allocation traces (bench/traces/*.csv.xz: step,event,index,bytes; a training
// step or a serving request per step) through refpool's plain cache, through what users get by
// default and through a planned scope, on the host backend or a CUDA device, and reports peak
// memory reserved against peak live bytes, ns per request and driver calls in steady state. Every
// trace runs at least 3 x its steps after a warm-up that sees each step three times (a sequence
// is pending, then recorded, then its first replay commits its arena). "late allocs" are the
// driver calls of the second half of the measured steps: in random order (--shuffle) some steps
// are seen fewer than three times in the warm-up, so calls in the first half may still be warm-up.
//
// Rows: "default" is a default-constructed cache (on the host with segments on, as a GPU gets them
// by default) whose requests are cache-level requests inside a step opened without a key, the path
// frameworks take: planned by the cache's own key (auto_plans, on by default), so a sequence that
// repeats replays from an arena; "plain step" the same with auto_plans off (the default before
// automatic plans: segments alone); "cache ..." are plain scopes with the options named;
// "planned" a planned scope under a key on the default row's cache.
//
// Usage: trace_replay [--cuda] [--iterations N] [--variants K] [--sequences N] [--shuffle S] [--fresh] [--concat R]
//                     [--only LABEL] [--bounds] [--json FILE] TRACE.csv...
//   --variants K  also replays each trace as K sequences (its sizes scaled by (K + v) / K for
//                 v = 0..K-1, rounded up to 256 B) under one plan key: a loop with K distinct step
//                 sequences (variable sequence lengths).
//   --sequences N keeps the first N steps (after --variants): a loop of N distinct sequences, e.g.
//                 --variants 2 --sequences 24 on the 16-request serving trace is 24 request shapes in
//                 turn, more than a key's 16 plans (the shape of issue 36's H200 serving capture).
//   --shuffle S   steps in random order (seed S, the same order in every row) instead of in turn:
//                 serving traffic, where a request's shape is any of those seen (a loop that partly
//                 repeats nearby). The warm-up (3 x the steps) then sees each step about three
//                 times, not exactly: the first measured runs may still record (and call the driver).
//   --fresh       no sequence ever comes twice: each iteration's largest request is 256 B larger than
//                 in the iteration before (a stream of new shapes; peak live grows by at most
//                 256 B x iterations).
// ns/request is the replaying thread's CPU time (CLOCK_THREAD_CPUTIME_ID) per request in steady
// state, allocation and release: time the thread spent descheduled on a shared machine does not
// count. With --bounds, "bounds us" is the part of it spent opening and closing each scope or
// step (and releasing what the step left live), in microseconds a step; it reads the clock twice
// more a step, inside the measured time (about 1 us each where the clock is a system call: a VM).
//   --concat R    makes each step R copies of itself, one after the other (a longer run: 7 copies
//                 of the GPT step are a 3,115-request step)
//   --only LABEL  runs only that configuration ("cache exact", "cache pow2:4", "cache segments",
//                 "default", "plain step", "planned"), e.g.
//                 under callgrind: valgrind --tool=callgrind --instr-atstart=no trace_replay ...
//                 counts only the steady-state iterations (instructions per request = Ir / the
//                 request count printed).
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <refpool/refpool.hpp>

#include "timing.hpp"
#include "trace_file.hpp"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define REFPOOL_BENCH_COUNT_ON() CALLGRIND_START_INSTRUMENTATION
#define REFPOOL_BENCH_COUNT_OFF() CALLGRIND_STOP_INSTRUMENTATION
#else
#define REFPOOL_BENCH_COUNT_ON() (void)0
#define REFPOOL_BENCH_COUNT_OFF() (void)0
#endif

namespace {

double thread_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

using event = refpool::bench::trace_event;
using step = refpool::bench::trace_step;
using refpool::bench::peak_live;
using refpool::bench::read_trace;
using refpool::bench::trace_name;

// The trace's steps as `count` sequences: sizes scaled by (count + v) / count, rounded up to 256 B.
std::vector<step> variants(const std::vector<step>& steps, int count) {
  if (count <= 1) return steps;
  std::vector<step> out;
  for (int v = 0; v < count; ++v) {
    for (const step& st : steps) {
      step scaled = st;
      for (event& e : scaled) {
        const double bytes = static_cast<double>(e.bytes) * (count + v) / count;
        e.bytes = static_cast<std::size_t>(std::ceil(bytes / 256.0)) * 256;
      }
      out.push_back(std::move(scaled));
    }
  }
  return out;
}

// Each step as `copies` copies of itself in a row (buffer indices of copy c shifted past copy c-1's).
std::vector<step> concatenated(const std::vector<step>& steps, int copies) {
  if (copies <= 1) return steps;
  std::vector<step> out;
  for (const step& st : steps) {
    std::size_t span = 0;
    for (const event& e : st) span = std::max(span, e.index + 1);
    step joined;
    for (int c = 0; c < copies; ++c)
      for (event e : st) {
        e.index += static_cast<std::size_t>(c) * span;
        joined.push_back(e);
      }
    out.push_back(std::move(joined));
  }
  return out;
}

struct result {
  double ns_per_request = 0;
  double us_per_step_bounds = 0;  ///< of that time: opening and closing the scope or step, a step
  std::size_t held_bytes = 0;     ///< backend bytes outstanding after the last iteration
  std::uint64_t steady_driver_allocations = 0;
  std::uint64_t late_driver_allocations = 0;  ///< of those, in the second half of the measured steps
  std::uint64_t steady_requests = 0;
  int measured_steps = 0;
  refpool::cache_stats stats;
};

enum class request_path { scope, planned_scope, step };

// One configuration: requests inside a plain scope, a planned scope, or a plain step (cache-level
// requests), on a cache with `options`.
result replay(const refpool::backend& be, const std::vector<step>& steps, int iterations,
              refpool::cache_options options, request_path how, bool time_bounds, bool fresh, unsigned shuffle) {
  result out;
  {
    refpool::alloc_cache cache{options};
    std::vector<refpool::data_ref> live;
    std::size_t requests = 0;
    double seconds = 0;
    double bound_seconds = 0;  // opening and closing the scope or step (and releasing what it left)
    int measured_steps = 0;
    std::uint64_t allocations_at_steady = 0;
    std::uint64_t allocations_at_half = 0;
    const int warmup = static_cast<int>(3 * steps.size());  // every sequence seen three times
    const int half = warmup + (iterations - warmup) / 2;    // "late allocs" count from here
    // Driver calls so far: block allocations and calls that grew segments (commits, segment allocations).
    const auto driver_calls = [&] { return be.allocation_count() + cache.stats().segment_grows; };
    step renamed;  // --fresh: this iteration's step, its largest request grown
    std::mt19937 order(shuffle);  // --shuffle: every row draws the same steps
    for (int it = 0; it < iterations; ++it) {
      const std::size_t next = shuffle != 0 ? order() % steps.size() : static_cast<std::size_t>(it) % steps.size();
      const step* chosen = &steps[next];
      if (fresh) {
        renamed = *chosen;
        auto largest = std::max_element(renamed.begin(), renamed.end(),
                                        [](const event& a, const event& b) { return a.bytes < b.bytes; });
        const std::size_t index = largest->index;
        for (event& e : renamed)
          if (e.alloc && e.index == index) e.bytes += 256 * static_cast<std::size_t>(it + 1);
        chosen = &renamed;
      }
      const step& st = *chosen;
      if (it == warmup) {
        allocations_at_steady = driver_calls();
        bound_seconds = 0;
        REFPOOL_BENCH_COUNT_ON();
      }
      // Outside the timed part; under callgrind a stats() call once a run is noise.
      if (it == half) allocations_at_half = driver_calls();
      const double start = thread_seconds();
      {
        std::optional<refpool::scope> in_scope;
        std::optional<refpool::step> in_step;
        const bool in_a_step = how == request_path::step;
        if (in_a_step) {
          in_step.emplace(cache);  // no key: the cache's options decide (auto_plans)
        } else {
          in_scope.emplace(cache, refpool::scope_options{.plan = how == request_path::planned_scope ? "trace" : ""});
        }
        const double opened = time_bounds ? thread_seconds() : 0;
        for (const event& e : st) {
          if (e.alloc) {
            if (live.size() <= e.index) live.resize(e.index + 1);
            live[e.index] = in_a_step ? cache.allocate(be, e.bytes) : refpool::allocate(be, e.bytes);
          } else {
            live[e.index].reset();
          }
        }
        const double served = time_bounds ? thread_seconds() : 0;
        for (auto& r : live) r.reset();  // what the step did not free goes at its end
        in_step.reset();
        in_scope.reset();
        if (time_bounds) bound_seconds += (opened - start) + (thread_seconds() - served);
      }
      if (it >= warmup) {
        seconds += thread_seconds() - start;
        ++measured_steps;
        for (const event& e : st) requests += e.alloc;
      }
    }
    REFPOOL_BENCH_COUNT_OFF();
    out.ns_per_request = seconds * 1e9 / static_cast<double>(std::max<std::size_t>(requests, 1));
    out.us_per_step_bounds = bound_seconds * 1e6 / std::max(measured_steps, 1);
    out.measured_steps = measured_steps;
    out.steady_requests = requests;
    out.stats = cache.stats();
    const std::uint64_t calls = driver_calls();
    out.steady_driver_allocations = calls - allocations_at_steady;
    out.late_driver_allocations = calls - allocations_at_half;
    out.held_bytes = be.outstanding_bytes();
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // Real programs have threads (a GPU driver starts its own), and glibc makes locks cheaper in a
  // process that never had one: a thread started and joined first makes the host rows honest.
  std::thread([] {}).join();
  bool use_cuda = false;
  int iterations = 60;
  int variant_count = 1;
  int copies = 1;
  std::size_t sequence_count = 0;  // 0: all
  bool fresh = false;
  unsigned shuffle = 0;  // 0: in turn
  std::string only;
  bool time_bounds = false;
  std::string json_path = "trace_replay.json";
  std::vector<std::string> traces;
  CLI::App app{"Replays captured allocation traces through refpool's caches, side by side"};
  app.add_flag("--cuda", use_cuda, "On CUDA device 0 instead of the host");
  app.add_option("--iterations", iterations, "Steps measured, at least (6 x the trace's steps)")->capture_default_str();
  app.add_option("--variants", variant_count, "Copies of each step with sizes varied, as distinct sequences")
      ->capture_default_str();
  app.add_option("--sequences", sequence_count, "Keep the first N steps (after --variants), 0: all")
      ->capture_default_str();
  app.add_option("--shuffle", shuffle, "Steps in random order, from this seed (0: in turn)")->capture_default_str();
  app.add_flag("--fresh", fresh, "No sequence ever comes twice (each iteration's largest request grows)");
  app.add_option("--concat", copies, "Copies of the trace one after another")->capture_default_str();
  app.add_flag("--bounds", time_bounds, "Time the step bounds (us a step)");
  app.add_option("--only", only, "Only the rows whose label contains this");
  app.add_option("--json", json_path, "Write the rows to this file")->capture_default_str();
  app.add_option("trace", traces, "Trace files (bench/traces/*.csv.xz, or a capture's .csv)")
      ->required()
      ->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);
  if (use_cuda && !refpool::cuda::available()) {
    fmt::print("--cuda needs a CUDA device: {}\n", refpool::cuda::unavailable_reason());
    return 77;
  }
  refpool::bench::json_rows json;
  fmt::print("{:<20} {:<14} {:>8} {:>12} {:>12} {:>10} {:>10} {:>12} {:>14} {:>12} {:>10} {:>10}\n", "trace", "refpool",
             "requests", "peak live", "peak resvd", "resvd/live", "ns/req", "bounds us", "steady allocs", "late allocs",
             "plan hits", "measured");
  for (const std::string& path : traces) {
    auto steps = concatenated(variants(read_trace(path), variant_count), copies);
    if (sequence_count != 0 && sequence_count < steps.size()) steps.resize(sequence_count);
    // A warm-up that sees every step three times, then at least 3 x the steps measured.
    const int runs = std::max(iterations, static_cast<int>(6 * steps.size()));
    const std::size_t live = peak_live(steps);
    std::size_t requests = 0;
    for (const auto& st : steps)
      for (const auto& e : st) requests += e.alloc;
    std::string name = trace_name(path);
    if (variant_count > 1) name += fmt::format(" x{}", variant_count);
    if (copies > 1) name += fmt::format(" +{}", copies);
    if (sequence_count != 0) name += fmt::format(" /{}", steps.size());
    if (shuffle != 0) name += " shuffled";
    if (fresh) name += " fresh";
    struct config {
      const char* label;
      refpool::cache_options options;
      request_path how;
    };
    // Segments explicitly off except in the segments row: the default (automatic) carves pieces
    // for device memory, so --cuda would otherwise measure segments in every row.
    refpool::cache_options exact;
    exact.segments = refpool::segment_policy::off;
    refpool::cache_options pow2 = exact;
    pow2.rounding = refpool::rounding_policy::pow2(4);
    refpool::cache_options segments;
    segments.segments = refpool::segment_policy::on;
    refpool::cache_options defaults;  // what alloc_cache{} gives (segments automatic: on for GPU memory)
    if (!use_cuda) defaults.segments = refpool::segment_policy::on;  // as a GPU gets them
    refpool::cache_options plain_step = defaults;
    plain_step.auto_plans = false;
    for (const config& c :
         {config{"default", defaults, request_path::step}, config{"plain step", plain_step, request_path::step},
          config{"cache exact", exact, request_path::scope}, config{"cache pow2:4", pow2, request_path::scope},
          config{"cache segments", segments, request_path::scope},
          config{"planned", defaults, request_path::planned_scope}}) {
      if (!only.empty() && only != c.label) continue;
      // A fresh backend per run, so its counters describe this run alone.
      const refpool::backend be = use_cuda ? refpool::cuda::device(0) : refpool::make_host_backend();
      const std::size_t before = be.outstanding_bytes();
      const result r = replay(be, steps, runs, c.options, c.how, time_bounds, fresh, shuffle);
      const std::size_t held = r.held_bytes - std::min(before, r.held_bytes);
      const std::size_t reserved = r.stats.peak_reserved_bytes;
      fmt::print(
          "{:<20} {:<14} {:>8} {:>10.1f}MB {:>10.1f}MB {:>9.3f}x {:>10.1f} {:>12.2f} {:>14} {:>12} {:>10} {:>10}\n",
          name, c.label, requests / steps.size(), live / 1e6, reserved / 1e6, static_cast<double>(reserved) / live,
          r.ns_per_request, r.us_per_step_bounds, r.steady_driver_allocations, r.late_driver_allocations,
          r.stats.plan_hits, r.steady_requests);
      json.add({{"trace", name},
                {"config", c.label},
                {"backend", use_cuda ? "cuda" : "host"},
                {"sequences", steps.size()},
                {"peak_live_bytes", live},
                {"held_bytes", held},
                {"ns_per_request", r.ns_per_request},
                {"steady_driver_allocations", r.steady_driver_allocations},
                {"late_driver_allocations", r.late_driver_allocations},
                {"steady_requests", r.steady_requests},
                {"plan_hits", r.stats.plan_hits},
                {"plan_misses", r.stats.plan_misses},
                {"arena_bytes", r.stats.arena_bytes},
                {"peak_reserved_bytes", reserved},
                {"peak_reserved_over_live", static_cast<double>(reserved) / live},
                {"segment_grows", r.stats.segment_grows},
                {"hits", r.stats.hits},
                {"misses", r.stats.misses},
                {"measured_steps", r.measured_steps},
                {"us_per_step_bounds", r.us_per_step_bounds}});
    }
  }
  if (!json.write(json_path)) fmt::print(stderr, "cannot write {}\n", json_path);
  return 0;
}
