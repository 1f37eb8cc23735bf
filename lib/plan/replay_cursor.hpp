// Where a planned run (run.hpp) stands in the plans it replays: the plan matched so far, its
// claimed arena, the position, and the regions that may still share bytes with the next one. Its
// replay path (take_region, advance) is inline: plan_run::acquire inlines it, and a call
// there costs a replayed request about a tenth of its instructions (bench/host/instructions.sh).
//
// Threads. Only the run's serving thread (or, for a step, the thread in its serving section)
// calls it; position() may be read by any thread (a release records where the run was).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "plan/arena.hpp"
#include "plan/plan.hpp"

namespace refpool::detail {

class replay_cursor {
 public:
  /// `thread`: the thread that serves the run, whose regions it hands out (null for a step's run).
  explicit replay_cursor(const void* thread) noexcept : thread_(thread) {}

  /// Requests served so far by the run (written by its serving thread).
  [[nodiscard]] std::uint64_t position() const noexcept { return position_.load(std::memory_order_relaxed); }
  /// The current plan's request at `at` (replay).
  [[nodiscard]] const planned_request& request(std::uint64_t at) const noexcept { return current_->request(at); }
  /// The plan matched so far (replay; null before and after).
  [[nodiscard]] plan* current() const noexcept { return current_; }
  /// A release later than recorded blocked a region: the plan's lifetimes no longer hold.
  [[nodiscard]] bool stale() const noexcept { return stale_; }

  /// Inlined also where the replay path catches (a call there needs this cursor's address, which
  /// the compiler then computes and keeps on the stack for every request).
  [[gnu::always_inline]] void advance(std::uint64_t to) noexcept {
    position_.store(to, std::memory_order_relaxed);
    if (arena_ != nullptr) arena_->position.store(to, std::memory_order_relaxed);
  }

  /// The region of the current plan at `at`; null when a live handle can still reach its bytes,
  /// or when the streams its arena's released regions were lent to cannot be ordered before
  /// `stream` now (a graph capture).
  /// `scan(at)` calls blocked(at) through the run (plan_run::blocked): a call here would need this
  /// cursor's address, which the compiler then computes and keeps on the stack for every request.
  template <class Scan>
  [[gnu::always_inline]] block* take_region(std::uint64_t at, stream_ref stream, Scan scan) {
    plan& p = *current_;
    if (at >= due_processed_) {
      // Regions the recording had released by now: one this run still holds is overdue.
      for (const std::uint32_t* d = p.due_begin(at); d != p.due_end(at); ++d)
        if (p.state(*d).state.load(std::memory_order_acquire) == region_state::live_in(generation_)) [[unlikely]]
          overdue_.push_back(*d);
      due_processed_ = at + 1;
    }
    // p.state(at) twice, not a reference kept across scan: the compiler then keeps no pointer on
    // the stack (one instruction a replayed request, callgrind).
    if ((p.state(at).state.load(std::memory_order_acquire) & region_state::live) != 0) [[unlikely]]
      return nullptr;
    // Only an overdue region of this run or a live region of another can share bytes with this one:
    // every other live region was recorded alive together with it, and placed apart.
    if ((!overdue_.empty() || !foreign_.empty()) && scan(at)) [[unlikely]]
      return nullptr;
    // After every acquire load of a region's state above: a release this run saw there added its
    // streams (record_stream) before it published the region free, so they are pending here. Checked
    // first, the flag could be read before such a release and the bytes handed out unordered.
    if (arena_->waits_pending()) [[unlikely]]
      if (!arena_->wait_for_pending(stream)) return nullptr;  // not orderable now (a graph capture): a miss
    region_block& r = p.region_at(at);
    r.thread = thread_;
    r.refs.reset(1);
    p.state(at).state.store(region_state::live_in(generation_), std::memory_order_relaxed);
    return &r;
  }

  /// An overdue region of this run or a live one of another run may share bytes with the region
  /// at `at` (take_region's slow check). An overdue one makes the replay stale.
  [[nodiscard]] bool blocked(std::uint64_t at);

  /// Replays `first` in `a`, which the run claimed and took: a new generation of the arena, and
  /// the regions other runs left live in it. Throws (no host memory) with the claim given up.
  void start(plan& first, arena& a);
  /// A request at `at` that the current plan did not record: moves to the first of `candidates`
  /// that recorded the same requests up to `at` and then `request`, in the same arena. The regions
  /// this run holds of the plan it leaves become foreign (they may share bytes with the new one's).
  /// False when none does.
  [[nodiscard]] bool switch_to(const std::vector<plan*>& candidates, const planned_request& request, std::uint64_t at);
  /// Replay ends here: later positions are recorded.
  void stop() noexcept { replayed_to_ = position(); }

  /// The run's end (`end` requests), with the serving section held: pins the regions still live
  /// (their plans stay alive, the next run of the arena avoids their bytes), drops the foreign
  /// ones, and writes the lifetimes of the run's regions into `lifetimes` (if any). Returns the
  /// number pinned: escapes.
  std::size_t settle(std::uint64_t end, std::vector<lifetime>* lifetimes) noexcept;
  /// After the serving section: idles the arena's span if nothing pins it, and unclaims it.
  void leave_arena() noexcept;
  /// The live bytes the replayed plans could reach at once: an upper bound for the run's peak.
  [[nodiscard]] std::size_t replayed_peak() const noexcept;
  /// The replayed positions' requests, where `lifetimes` says a region of this run served them.
  void fill_recording(std::vector<planned_request>& sequence, const std::vector<lifetime>& lifetimes,
                      std::vector<bool>& known) const;
  /// The run ended: forgets its plans (the run's candidates keep them until the store read them).
  void forget_plans() noexcept {
    current_ = nullptr;
    segments_.clear();
  }

 private:
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

  const void* const thread_;                ///< the serving thread of a scope's run; null for steps
  plan* current_ = nullptr;                 ///< replay: the plan matched so far
  arena* arena_ = nullptr;                  ///< its arena, claimed by this run until it ends
  std::uint64_t generation_ = 0;            ///< this run's number in arena_
  std::atomic<std::uint64_t> position_{0};  ///< requests served so far (written by the serving thread)
  std::uint64_t due_processed_ = 0;         ///< due lists of current_ below this position were checked
  std::vector<std::uint32_t> overdue_;      ///< regions of current_ this run still holds past their recorded release
  std::vector<foreign_region> foreign_;     ///< live regions of other runs or plans in arena_
  std::uint64_t segment_from_ = 0;          ///< current_ serves from this position
  std::uint64_t replayed_to_ = 0;           ///< positions below came from plans (replay), later ones were recorded
  std::vector<segment> segments_;           ///< earlier plans of this run (after switches)
  bool stale_ = false;                      ///< see stale()
  bool idle_at_end_ = false;                ///< settle found no region of arena_ live
};

}  // namespace refpool::detail
