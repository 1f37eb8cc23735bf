// A planned run: one planned scope (or planned step) from its first request to its end. It
// replays the plan of its key that matches its requests, handing out that plan's regions; records
// its requests when none matches (or a late release made the plan stale); and falls back to the
// plain cache for a request whose region a live handle can still reach.
//
// Its parts: where the replay stands (replay_cursor.hpp, the inlined path's state), what it
// records of blocks that are not regions (recorder.hpp), and the mode machine (mode_state:
// run_modes.cpp starts, switches and diverges; run_end.cpp ends).
//
// Threads. A scope's run is served by its scope's thread only: the replay path takes no lock and
// makes no atomic read-modify-write. A step's run may be served by several threads at once: its
// requests are matched one at a time under serving_, so an interleaving that differs from the
// plan diverges and falls back, and no byte ever has two owners (serving_ is free for the thread
// that served the last request). Releases come from any thread at any time, also after the run
// ended.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "cache/cache_state.hpp"
#include "plan/plan.hpp"
#include "plan/recorder.hpp"
#include "plan/replay_cursor.hpp"
#include "plan/serving_lock.hpp"
#include "plan/store.hpp"

namespace refpool::detail {

class plan_run final : public ref_counted<plan_run>, public request_router, public release_observer {
 public:
  /// Opens a planned step or scope of `key` on `cache` (plan_store::begin_run): its run, or null
  /// when the key is in pass (`passing` names it then: pass_ticket). `shared`: a step's run,
  /// served by any thread (else only the opening thread serves it).
  static plan_run* open(cache_state& cache, std::string_view key, bool shared, pass_ticket& passing);
  /// A run of `key` of `store` (plan_store::begin_run makes it, holding the store's mutex), of
  /// `kind` (learn or probe), with the key's plans `candidates` (retained here).
  plan_run(cache_state& cache, plan_store& store, key_state* key, run_kind kind, std::vector<plan*> candidates,
           bool may_record, bool shared);

  /// Serves one request of this run (a region; the plain cache through `lease`; or, while
  /// recording, the backend directly).
  block* acquire(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) override;
  /// A block of this run that is not a region (a fallback or a recorded one) lost its last handle.
  void observe_release(block* b, bool via_unsafe_free) noexcept override;
  void retain_router() noexcept override { retain(); }
  void release_router() noexcept override { release(); }
  /// The run ends: counts escapes, pins regions still live, and hands its recording to the store
  /// (which places it with the serving lock free). Later requests (a step's thread that was late)
  /// go to the plain cache.
  void finish() noexcept;

  /// Counters of the running run (stats read them while it runs; the store adds them at its end).
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> misses{0};

 private:
  friend class ref_counted<plan_run>;
  ~plan_run();

  enum class mode : std::uint8_t {
    start,     ///< no request yet
    replay,    ///< handing out regions of the cursor's plan (its arena is claimed)
    record,    ///< recording: served by the plain cache and tracked
    plain,     ///< served by the plain cache, unrecorded (busy arena, paused key)
    finished,  ///< ended: late requests go to the plain cache
    probe,     ///< a probe of a key in pass: the plain cache, fingerprinted, nothing tracked
  };
  /// The mode machine (run_modes.cpp): how the next request is served, and what the run met
  /// that its end reports to the store.
  struct mode_state {
    mode now = mode::start;
    bool may_record = true;       ///< the key is not paused: a new sequence is recorded
    bool busy = false;            ///< another run held the arena of the plan that matched
    bool busy_other_key = false;  ///< ... a run of another key
    bool asked = false;           ///< a request came past the inlined replay (served or not)
  };

  block* serve(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream);
  block* replay_one(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream, std::uint64_t at);
  [[gnu::noinline, gnu::cold]] bool blocked(std::uint64_t at);  // the cursor's take_region's slow check
  block* serve_slow(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream);
  void begin_with(const planned_request& request);
  void diverge();
  /// A run that replayed and cannot record (its key paused) is hashed from its start: its
  /// requests so far were its plan's (switches keep only plans that match the run so far).
  void hash_replayed() noexcept;
  block* fallback(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream);
  void track(block* b, const planned_request& request, std::uint64_t at) noexcept;
  run_outcome finish_locked(std::vector<plan*>& started_with) noexcept;
  recording* make_recording(std::uint64_t end, std::vector<lifetime> region_lifetimes) const;

  cache_state& cache_;
  plan_store& store_;
  key_state* key_ = nullptr;
  const bool shared_;
  serving_lock serving_;  // shared runs: one request (and the end) at a time

  mode_state mode_;
  std::vector<plan*> candidates_;  ///< the key's plans at the start, most recently used first (retained)
  replay_cursor cursor_;           ///< where the replay stands (the inlined path's state)
  run_recorder recorder_;          ///< the blocks that are not regions, for the recording
};

}  // namespace refpool::detail
