// The fuzz harness: decodes input bytes into operations, runs each on the main or the helper
// thread (one at a time, so results are deterministic), and compares refpool with the model
// after every operation: results and exception types, the address each allocation got (a block,
// or a region of a plan), every backend call, all stats of both caches (plan counters included),
// backend bytes outstanding, and the state of every handle. Every live buffer carries its owner's
// byte pattern, checked before it is dropped and every 16 operations, so a buffer handed to two
// owners would show the other owner's bytes. Planned scopes and steps run under a few keys, so
// recordings, replays, divergences, several plans per key and busy arenas all happen. Buffers are
// also handed to the pointer table and freed by address (twice, at times: a double free).
//
// This file: the entry point (run_input), the report of a mismatch, and the totals. One input's
// session (session.hpp) runs in the files session.hpp lists.
#include "harness.hpp"

#include "session.hpp"

namespace refpool::test::fuzz {

totals all;
bool tracing = std::getenv("REFPOOL_FUZZ_TRACE") != nullptr;
int op_thread = 0;
std::uint64_t op_index = 0;
std::size_t op_code = 0;
bool in_cleanup = false;

namespace {

std::vector<std::uint8_t> current_input;  // the input being run, for REFPOOL_FUZZ_KEEP

}  // namespace

helper_thread& helper() {
  static helper_thread instance;
  return instance;
}

void fail(const std::string& what) {
  const std::string where = in_cleanup ? "cleanup" : fmt::format("operation {} (code {})", op_index, op_code);
  fmt::print(stderr, "\nrefpool fuzz: MISMATCH in {} on thread {}:\n  {}\n", where, op_thread, what);
  if (const char* keep = std::getenv("REFPOOL_FUZZ_KEEP")) {  // the input, to replay or add to the corpus
    if (std::FILE* f = std::fopen(keep, "wb")) {
      std::fwrite(current_input.data(), 1, current_input.size(), f);
      std::fclose(f);
      fmt::print(stderr, "  (input of {} bytes written to {})\n", current_input.size(), keep);
    }
  }
  if (!tracing) fmt::print(stderr, "  (rerun with REFPOOL_FUZZ_TRACE=1 to print every operation)\n");
  std::fflush(stderr);
  std::abort();
}

void run_input(const std::uint8_t* data, std::size_t size) {
  current_input.assign(data, data + size);
  in_cleanup = false;
  op_index = 0;
  if (tracing) fmt::print(stderr, "input of {} bytes\n", size);
  session s(data, size);
  s.run();
}

const totals& get_totals() noexcept { return all; }

void print_totals() {
  fmt::print(stderr,
             "refpool fuzz: {} operations in {} inputs; hits {}, misses {}, steals {}, escapes {}, unsafe frees {}, "
             "evictions {}, reclaimed {}, oom retries {}; faults injected {}, limit refusals {}; expected errors "
             "checked {}\n",
             all.operations, all.inputs, all.hits, all.misses, all.steals, all.escapes, all.unsafe_frees, all.evictions,
             all.reclaimed, all.oom_retries, all.injected_faults, all.limit_failures, all.expected_errors);
  fmt::print(
      stderr,
      "refpool fuzz: planned: {} runs, {} region hits, {} conflicts, {} divergences, {} recordings, {} escapes, "
      "{} stale plans, {} busy runs, {} pauses, {} plans dropped, {} arena segments made ({} freed; spans yielded {}, "
      "moved {}, extended {}, made again larger {}); {} steps, {} "
      "cache-level requests; escapes of dropped plans released last on the other thread during a run {}; "
      "keys that passed {} ({} runs with no router), learned again {} ({} with a pause lifted), kept more plans {}; "
      "recordings of "
      "runs open at their key's pass entry {}; failed probe requests {}\n",
      all.plan_runs, all.region_hits, all.conflicts, all.divergences, all.recordings, all.run_escapes, all.stale,
      all.busy_runs, all.pauses, all.plan_evictions, all.arenas, all.arena_frees, all.span_yields, all.span_moves,
      all.span_extensions, all.span_remakes, all.steps, all.cache_level, all.dropped_escapes_released_elsewhere,
      all.pass_entries, all.pass_runs, all.learned_again, all.pauses_lifted, all.capacity_growths,
      all.passing_recordings, all.failed_probes);
  fmt::print(stderr,
             "refpool fuzz: requests held in the backend while their cache was destroyed {}, their step ended {}, "
             "their cache reclaimed {}, a buffer released {} ({} through scopes); late frees of an address handed "
             "out again {}; double frees racing pointer_ref {} ({} handles taken meanwhile); rejected configure "
             "calls {}\n",
             all.held_destroyed, all.held_step_ended, all.held_reclaimed, all.held_released, all.held_in_scopes,
             all.stale_frees_rehanded, all.racing_frees, all.racing_pins, all.configure_failures);
  fmt::print(stderr,
             "refpool fuzz: releases whose eviction was held while their cache was destroyed {}; requests after a "
             "thread's teardown {}, after the process's {}\n",
             all.release_held_destroyed, all.thread_end_requests, all.process_end_requests);
  print_segment_totals();
  std::fflush(stderr);
}

}  // namespace refpool::test::fuzz
