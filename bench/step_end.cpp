// Step ends against requests of other threads (issue 35, "bounded step ends"): the main thread
// runs a key-less step per iteration while T threads make 4 KiB requests, each freed before the
// next (lifetimes that never overlap), as a server's workers do under a training or serving loop.
// A step takes L requests (L cycles through 8 lengths, 1,000 to 8,000), then each worker makes one
// more, which races the step's end, and waits for the next step. So the cache's own key collects
// up to 16 pending sequences of a few lengths and, when one comes again, makes plans of all of
// them at that step's end. Measured: how long step::end() takes and how long one request
// (alloc_cache::allocate) takes, the longest and the 99th percentile, with automatic plans on
// and, side by side in the same run, off (a plain step: the floor), and the CPU time of the
// longest step end (its own work: on 2 cores the workers take the cores from it).
//
//   step_end [--json FILE] [--steps N] [--threads T,...]   (defaults step_end.json, 300, 2,4,8)
//
// Prints a table and writes JSON.
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <refpool/refpool.hpp>

#include "timing.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point start, clock_type::time_point stop) {
  return std::chrono::duration<double, std::milli>(stop - start).count();
}

// CPU time of the calling thread: a step end's own work, without the time the workers' threads
// took the cores from it (2 cores, 8 workers).
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  const auto at = static_cast<std::size_t>(p * static_cast<double>(values.size() - 1));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(at), values.end());
  return values[at];
}

struct row {
  int threads = 0;
  bool planned = false;
  std::size_t steps = 0;
  std::uint64_t requests = 0;
  std::uint64_t plans_made = 0;
  std::uint64_t plan_hits = 0;
  double end_max_ms = 0, end_p99_ms = 0, end_median_ms = 0, end_cpu_max_ms = 0;
  double request_max_ms = 0, request_p99_ms = 0;
  double seconds = 0;
};

row run(int threads, bool planned, std::size_t steps) {
  const refpool::backend be = refpool::make_host_backend();
  refpool::cache_options options;
  options.auto_plans = planned;
  refpool::alloc_cache cache{options};
  std::atomic<std::uint64_t> tickets{0}, quota{0}, generation{0};
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> waits(static_cast<std::size_t>(threads));
  std::vector<std::thread> workers;
  const auto start = clock_type::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::vector<double>& mine = waits[static_cast<std::size_t>(t)];
      mine.reserve(1 << 18);
      const auto request = [&] {
        const auto before = clock_type::now();
        refpool::data_ref r = cache.allocate(be, 4096);
        const auto after = clock_type::now();
        refpool::bench::keep(r.data());
        r = {};
        mine.push_back(ms_since(before, after));
      };
      std::uint64_t seen = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        const std::uint64_t g = generation.load(std::memory_order_acquire);
        if (g == seen) {  // this step's share is done: wait for the next
          std::this_thread::yield();
          continue;
        }
        if (tickets.fetch_add(1, std::memory_order_relaxed) < quota.load(std::memory_order_relaxed)) {
          request();  // one of the step's L
          continue;
        }
        request();  // past the step's quota: it races the step's end
        seen = g;
      }
    });
  }
  static constexpr std::uint64_t lengths[] = {1000, 6000, 2000, 8000, 3000, 5000, 4000, 7000};
  std::vector<double> ends, end_cpu;
  for (std::size_t s = 0; s < steps; ++s) {
    refpool::step st(cache);
    const std::uint64_t length = lengths[s % std::size(lengths)];
    tickets.store(0, std::memory_order_relaxed);
    quota.store(length, std::memory_order_relaxed);
    generation.fetch_add(1, std::memory_order_release);
    while (tickets.load(std::memory_order_relaxed) < length) std::this_thread::yield();
    const auto before = clock_type::now();
    const double cpu_before = thread_cpu_ms();
    st.end();
    end_cpu.push_back(thread_cpu_ms() - cpu_before);
    ends.push_back(ms_since(before, clock_type::now()));
  }
  stop = true;
  for (auto& w : workers) w.join();
  row out;
  out.threads = threads;
  out.planned = planned;
  out.steps = steps;
  out.seconds = ms_since(start, clock_type::now()) / 1000;
  for (const auto& w : waits) out.requests += w.size();
  const auto stats = cache.stats();
  out.plans_made = stats.plan_recordings;
  out.plan_hits = stats.plan_hits;
  out.end_max_ms = *std::max_element(ends.begin(), ends.end());
  out.end_cpu_max_ms = *std::max_element(end_cpu.begin(), end_cpu.end());
  out.end_p99_ms = percentile(ends, 0.99);
  out.end_median_ms = percentile(ends, 0.5);
  std::vector<double> all;
  for (const auto& w : waits) all.insert(all.end(), w.begin(), w.end());
  out.request_max_ms = all.empty() ? 0 : *std::max_element(all.begin(), all.end());
  out.request_p99_ms = percentile(std::move(all), 0.99);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "step_end.json";
  std::size_t steps = 300;
  std::vector<int> thread_counts = {2, 4, 8};
  CLI::App app{"Step ends against requests of other threads, automatic plans on and off"};
  app.add_option("--json", json_path, "Write the rows to this file")->capture_default_str();
  app.add_option("--steps", steps, "Steps a row")->capture_default_str();
  app.add_option("--threads", thread_counts, "Worker threads, one row pair each")
      ->delimiter(',')
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  fmt::print("{:>7} {:>11} {:>9} {:>6} {:>9} | {:>11} {:>11} {:>11} {:>11} | {:>14} {:>14} | {:>17}\n", "threads",
             "steps", "requests", "plans", "plan hits", "end max ms", "(cpu ms)", "end p99 ms", "end med ms",
             "request max ms", "request p99 ms", "request max/plain");
  refpool::bench::json_rows rows;
  for (const int threads : thread_counts) {
    const row plain = run(threads, false, steps);
    const row auto_planned = run(threads, true, steps);
    for (const row& r : {plain, auto_planned}) {
      // The worst wait of a request against the same loop with plain steps (the floor: scheduling).
      const double ratio = plain.request_max_ms > 0 ? r.request_max_ms / plain.request_max_ms : 0;
      fmt::print(
          "{:>7} {:>11} {:>9} {:>6} {:>9} | {:>11.3f} {:>11.3f} {:>11.3f} {:>11.3f} | {:>14.3f} {:>14.4f} | {:>16.1f}x\n",
          r.threads, fmt::format("{} {}", r.steps, r.planned ? "auto" : "plain"), r.requests, r.plans_made, r.plan_hits,
          r.end_max_ms, r.end_cpu_max_ms, r.end_p99_ms, r.end_median_ms, r.request_max_ms, r.request_p99_ms, ratio);
      rows.add({{"threads", r.threads},
                {"steps", r.planned ? "auto" : "plain"},
                {"count", r.steps},
                {"requests", r.requests},
                {"plans_made", r.plans_made},
                {"plan_hits", r.plan_hits},
                {"end_max_ms", r.end_max_ms},
                {"end_cpu_max_ms", r.end_cpu_max_ms},
                {"end_p99_ms", r.end_p99_ms},
                {"end_median_ms", r.end_median_ms},
                {"request_max_ms", r.request_max_ms},
                {"request_p99_ms", r.request_p99_ms},
                {"request_max_vs_plain", ratio},
                {"seconds", r.seconds}});
    }
  }
  if (!rows.write(json_path)) {
    fmt::print(stderr, "cannot write {}\n", json_path);
    return 1;
  }
  fmt::print("JSON: {}\n", json_path);
  return 0;
}
