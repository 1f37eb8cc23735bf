// The model-based fuzz harness: decodes bytes into refpool operations on two caches, two
// backends and two threads, runs each against refpool and the reference model (model.hpp), and
// aborts with a report at the first difference. Shared by the libFuzzer target and the
// corpus replay executable.
#pragma once

#include <cstddef>
#include <cstdint>

namespace refpool::test::fuzz {

/// Runs one input. Deterministic: the same bytes give the same operations and results.
void run_input(const std::uint8_t* data, std::size_t size);

/// Counts over all inputs run in this process.
struct totals {
  std::uint64_t inputs = 0;
  std::uint64_t operations = 0;       ///< decoded operations executed and checked
  std::uint64_t injected_faults = 0;  ///< failing_resource failures (out of memory or backend_error)
  std::uint64_t limit_failures = 0;   ///< limiting_resource refusals (real out of memory)
  std::uint64_t hits = 0, misses = 0, steals = 0, escapes = 0, unsafe_frees = 0, evictions = 0, reclaimed = 0,
                oom_retries = 0, expected_errors = 0;
  /// Planned scopes and steps, from the model: runs, requests served by a region, conflicts
  /// (fell back), divergences, recordings, escapes of runs, busy runs, pauses, arenas made/freed.
  std::uint64_t plan_runs = 0, region_hits = 0, conflicts = 0, divergences = 0, recordings = 0, run_escapes = 0,
                busy_runs = 0, pauses = 0, arenas = 0, arena_frees = 0, span_yields = 0, span_moves = 0,
                span_extensions = 0, span_remakes = 0, steps = 0, cache_level = 0, stale = 0, plan_evictions = 0;
  /// Keys whose sequences did not repeat: times one entered pass, its runs that passed (no router),
  /// and times one learned again after its probes saw repeats (plan_loop_ops.cpp, op_plan_stream);
  /// times a key's plan capacity grew to follow a loop longer than it kept.
  std::uint64_t pass_entries = 0, pass_runs = 0, learned_again = 0, capacity_growths = 0;
  std::uint64_t passing_recordings = 0, failed_probes = 0, pauses_lifted = 0;  // fixes the model must check
  /// The last reference to an escaped region of a dropped plan, released on the other thread while
  /// a planned loop's run goes on (plan_loop_ops.cpp; issue 35).
  std::uint64_t dropped_escapes_released_elsewhere = 0;
  /// Requests held in the backend while the other thread destroyed their cache, ended their step,
  /// reclaimed or released a buffer (in_flight.cpp), and how many of them went through a scope;
  /// late frees of an address handed out again; double frees racing pointer_ref, and the handles
  /// pointer_ref gave meanwhile (pointer_ops.cpp); configure calls rejected (configure_ops.cpp).
  std::uint64_t held_destroyed = 0, held_step_ended = 0, held_reclaimed = 0, held_released = 0, held_in_scopes = 0,
                stale_frees_rehanded = 0, racing_frees = 0, racing_pins = 0, configure_failures = 0;
  /// Releases whose eviction was held in the backend while their cache was destroyed; inputs that
  /// ended with requests after a thread's teardown and after the process's (teardown_ops.cpp).
  std::uint64_t release_held_destroyed = 0, thread_end_requests = 0, process_end_requests = 0;
};
[[nodiscard]] const totals& get_totals() noexcept;
/// "N operations in M inputs: ..." for the logs.
void print_totals();

}  // namespace refpool::test::fuzz
