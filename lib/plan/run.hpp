// A planned run: one planned scope (or planned step) from its first request to its end. It
// replays the plan of its key that matches its requests, handing out that plan's regions; records
// its requests when none matches (or a late release made the plan stale); and falls back to the
// plain cache for a request whose region a live handle can still reach.
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
#include "cache/spinlock.hpp"
#include "plan/plan.hpp"
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
    replay,    ///< handing out regions of current_ (its arena is claimed)
    record,    ///< recording: served by the plain cache and tracked
    plain,     ///< served by the plain cache, unrecorded (busy arena, paused key)
    finished,  ///< ended: late requests go to the plain cache
    probe,     ///< a probe of a key in pass: the plain cache, fingerprinted, nothing tracked
  };
  /// A block that is not a region: its request and lifetime, for the recording.
  struct tracked {
    planned_request request;
    std::uint64_t position;
    std::uint64_t released_at;
    bool live;
    bool cached;  ///< a cached block: the cache counts its escape
  };
  /// A live region another run or plan handed out, in the arena this run uses.
  struct foreign_region {
    plan* owner;  ///< retained
    std::uint32_t index;
    std::uint64_t live_state;
  };
  /// Requests [from, to) of the run were matched against `owner` (a plan switch starts a new one).
  struct segment {
    plan* owner;
    std::uint64_t from;
    std::uint64_t to;
  };

  block* serve(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream);
  block* replay_one(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream, std::uint64_t at);
  block* serve_slow(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream);
  block* take_region(std::uint64_t at, stream_ref stream);
  [[nodiscard]] bool blocked(std::uint64_t at);
  void begin_with(const planned_request& request);
  [[nodiscard]] bool switch_to(const planned_request& request, std::uint64_t at);
  void diverge();
  block* fallback(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream);
  void track(block* b, const planned_request& request, std::uint64_t at) noexcept;
  void reserve_tracking();
  void advance(std::uint64_t to) noexcept;
  run_outcome finish_locked(std::vector<plan*>& started_with) noexcept;
  std::size_t settle_regions(std::uint64_t end, std::vector<lifetime>* lifetimes) noexcept;
  void leave_arena() noexcept;  // after the serving section: idles the span if nothing pins it, unclaims
  recording* make_recording(std::uint64_t end, std::vector<lifetime> region_lifetimes) const;

  cache_state& cache_;
  plan_store& store_;
  key_state* key_ = nullptr;
  const bool shared_;
  serving_lock serving_;      // shared runs: one request (and the end) at a time
  const void* const thread_;  ///< the serving thread of a scope's run; null for steps

  mode mode_ = mode::start;
  bool may_record_ = true;
  bool stale_ = false;
  bool busy_ = false;
  bool busy_other_key_ = false;
  std::vector<plan*> candidates_;           ///< the key's plans at the start, most recently used first (retained)
  plan* current_ = nullptr;                 ///< replay: the plan matched so far
  arena* arena_ = nullptr;                  ///< its arena, claimed by this run until it ends
  bool idle_at_end_ = false;                ///< settle_regions found no region of arena_ live
  std::uint64_t generation_ = 0;            ///< this run's number in arena_
  std::vector<segment> segments_;           ///< earlier plans of this run (after switches)
  std::uint64_t segment_from_ = 0;          ///< current_ serves from this position
  std::uint64_t replayed_to_ = 0;           ///< positions below came from plans (replay), later ones were recorded
  std::uint64_t due_processed_ = 0;         ///< due lists of current_ below this position were checked
  std::vector<std::uint32_t> overdue_;      ///< regions of current_ this run still holds past their recorded release
  std::vector<foreign_region> foreign_;     ///< live regions of other runs or plans in arena_
  std::atomic<std::uint64_t> position_{0};  ///< requests served so far (written by the serving thread)
  fingerprint probed_;                      ///< probe: the sizes asked for so far
  bool asked_ = false;                      ///< a request came past the inlined replay (served or not)

  mutable spinlock lock_;  // guards what releases write: tracked_, uncached_live_, finished_
  std::vector<tracked> tracked_;
  std::size_t uncached_live_ = 0;
  bool finished_ = false;
  backend_state* first_backend_ = nullptr;  ///< retained until the end: a recording's backend outlives its blocks
};

}  // namespace refpool::detail
