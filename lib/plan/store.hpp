// The plans of one cache, by key, and the policy that keeps them useful in real loops
// (docs/design.md, "Planned scopes"): up to a key's capacity of plans, least recently used
// dropped first; a key that keeps re-recording is paused (its runs use the plain cache) with a
// backoff; keys share one arena per backend and stream until their runs are seen to overlap in
// time; arenas grow in place where the backend has virtual memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <refpool/stats.hpp>

#include "cache/cache_state.hpp"
#include "plan/arena_source.hpp"
#include "plan/key_policy.hpp"
#include "plan/plan.hpp"

namespace refpool::detail {

class plan_run;
class plan_store;
struct key_state;

/// A run of a key in pass (repeat_detector): its step or scope has no router, and its end counts
/// at its key. Held by the step or scope (which retains the cache, and so the store).
class pass_ticket {
 public:
  void begin(plan_store& store, key_state* key) noexcept {
    store_ = &store;
    key_ = key;
  }
  /// The run ended: counted once; nothing when none began.
  void end() noexcept;

 private:
  plan_store* store_ = nullptr;
  key_state* key_ = nullptr;
};

/// A plan key and its plans. Fields are guarded by the store's mutex.
struct key_state {
  std::string name;
  std::vector<plan*> plans;              ///< retained by the store
  std::vector<std::uint64_t> last_used;  ///< per plan: the store's clock at its last complete run
  /// Recordings of sequences seen once (retained, no arena yet), oldest first: a sequence becomes
  /// a plan only when it comes again, and then every pending one of the key does too.
  std::vector<recording*> pending;  ///< owned
  bool own_arena = false;           ///< its runs met another key's run on a shared arena
  std::uint64_t runs = 0;           ///< runs ended
  std::uint32_t rerecordings = 0;   ///< bit i: the run i runs ago re-recorded
  std::uint64_t paused_until = 0;   ///< no recording while runs < paused_until
  std::uint64_t next_pause = 0;     ///< length of the next pause, in runs
  std::size_t longest_run = 0;      ///< the most requests a run of it made (its capacity's budget)
  /// The highest bytes of its regions live at once in a run ended since the last reset_peaks (its
  /// replayed plans' peaks), or live at that reset: this key's share of peak_allocated_bytes.
  std::size_t peak_plan_live = 0;
  /// A plan joined since its last complete replay: the next one gives the plain path's idle memory back.
  bool reclaim_at_replay = false;
  repeat_detector repeats;  ///< whether its sequences come again: learn, or pass and probe
};

/// What a run did, handed to the store at its end.
struct run_outcome {
  plan* used = nullptr;           ///< the plan it replayed to its end (becomes the most recently used)
  recording* made = nullptr;      ///< its recording, not yet placed (owned: the store adopts it)
  bool busy = false;              ///< its arena was held by another run
  bool busy_other_key = false;    ///< ... of another key
  bool unrecorded = false;        ///< served by the plain cache, unrecorded, because its key was paused
  std::size_t replayed_peak = 0;  ///< the largest peak live bytes of the plans it replayed regions of
  bool probed = false;            ///< a probe of a key in pass: served by the plain cache, fingerprinted
  std::uint64_t fingerprint = fingerprint::unknown;  ///< its sequence's (repeat_detector::observe)
  std::size_t requests = 0;                          ///< requests it served
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
};

class plan_store final : public cache_extension {
 public:
  /// Plans kept per key at first: one per distinct sequence of a loop (variable lengths, several
  /// shapes). Also the recordings kept pending per key (sequences seen once, waiting to come
  /// again). A key whose sequences come again further apart keeps more (its detector's capacity),
  /// up to repeat_detector::ring and repeat_detector::planned_requests_per_key requests in all.
  static constexpr std::size_t plans_per_key = repeat_detector::first_capacity;
  /// A key whose last `thrash_window` runs re-recorded `thrash_rerecordings` times (a plan
  /// replaced by a recording of its own sequence, or dropped for a new one) is paused.
  static constexpr unsigned thrash_window = 16;
  static constexpr unsigned thrash_rerecordings = 4;
  /// Pauses last `first_pause` runs, doubling with each pause of the key up to `longest_pause`.
  static constexpr std::uint64_t first_pause = 64;
  static constexpr std::uint64_t longest_pause = 4096;

  explicit plan_store(cache_state& cache) : cache_(cache), arenas_(cache) {}
  ~plan_store() override;
  /// The store of `cache`, made at first use.
  static plan_store& of(cache_state& cache);

  /// A planned step or scope of `key` opens (shared: a step's run, which any thread may serve).
  /// Learning or probing: a run (owned by the caller), with the key's plans most recently used
  /// first, registered (stats() reads its counters). Passing: null, and `passing` holds the key,
  /// whose run end_pass counts: the step or scope opens with no router.
  plan_run* begin_run(std::string_view key, bool shared, pass_ticket& passing);
  /// A run ended: counts it, marks its plan used, adds its recording, applies the policy.
  void end_run(plan_run* run, key_state* key, run_outcome outcome) noexcept;
  /// A run of a key in pass ended (two mutex sections a step, no work a request).
  void end_pass(key_state* key) noexcept;
  /// A run that never began (its step could not open) is forgotten.
  void abandon_run(plan_run* run) noexcept;

  /// Drops every plan (the cache is closing); arenas go when their last region does.
  void close() noexcept override;
  void add_counters(cache_stats& out) const override;
  void reset_peaks() noexcept override;

 private:
  struct arena_group {
    const backend_state* backend;
    stream_ref stream;
    const key_state* owner;  ///< null: shared by every key without an arena of its own
    arena* memory;           ///< retained
  };
  /// A run's recording (adopted; placed only when it becomes a plan): a plan at once when the key has a plan of its
  /// sequence (a re-recording), pending when the sequence is new, and when it is pending already (it came again) it
  /// and every pending recording of the key become plans, largest first, into `plans` (owned, for add_plan). True
  /// when it dropped one (the oldest pending one). Caller holds growth_mutex_ only: the placements, O(n log n) each,
  /// hold up no request.
  bool adopt(key_state& key, recording* made, std::vector<plan*>& plans) noexcept;
  /// Adds `made` (adopted) to `key`, replacing its plan of the same sequence or the least
  /// recently used one beyond its capacity. True when it replaced or dropped one (a re-recording).
  /// Caller holds growth_mutex_ only.
  bool add_plan(key_state& key, plan* made) noexcept;
  void grow_and_install(key_state& key, plan* made, arena* old, std::size_t needed,
                        std::vector<plan*>& dropped) noexcept;
  void install(key_state& key, plan* made) noexcept;                 // caller holds mutex_, room reserved
  static bool bind(plan& made, arena& a) noexcept;                   // made.bind(a); false if it threw
  void reclaim_plain_memory(const backend_state& backend) noexcept;  // caller holds growth_mutex_ only
  void move_to_own_arena(key_state& key) noexcept;
  arena_group* group_for(const backend_state* backend, stream_ref stream, const key_state* owner) noexcept;
  [[nodiscard]] std::size_t needed_by(const arena* a) const noexcept;  // the largest plan bound to `a`
  void drop(key_state& key, std::size_t i, std::vector<plan*>& dropped) noexcept;
  /// The key's sequences do not repeat: its pending recordings and plans go, and an arena left
  /// with no plan of any key goes with its group (its memory once no run or region holds it).
  void enter_pass(key_state& key) noexcept;

  cache_state& cache_;
  arena_source arenas_;      // the memory of every arena of this store, and its regions' blocks
  std::mutex growth_mutex_;  // serialises adding plans: taken before mutex_; arenas are allocated under it alone
  mutable std::mutex mutex_;
  bool closed_ = false;
  std::uint64_t clock_ = 0;
  std::vector<std::unique_ptr<key_state>> keys_;
  std::vector<arena_group> groups_;
  std::vector<plan_run*> active_;  // runs begun and not ended (their counters are live)
  std::uint64_t hits_ = 0, misses_ = 0, recordings_ = 0, evictions_ = 0, pauses_ = 0, unrecorded_runs_ = 0,
                busy_runs_ = 0, replacements_ = 0, pass_runs_ = 0, probe_runs_ = 0, pass_entries_ = 0;
};

}  // namespace refpool::detail
