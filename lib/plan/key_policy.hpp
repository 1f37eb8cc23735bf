// The no-repeat policy of a plan key (docs/design.md, "Planned scopes", "A key that does not
// repeat"): whether its runs' sequences come again within what it keeps, and the modes that follow.
// A key whose sequences repeat learns (its runs replay, record and keep pending recordings); one
// whose sequences do not passes (its steps and scopes open with no router: the plain path, at the
// plain path's cost), probing now and then with a backoff whether they repeat again.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace refpool::detail {

/// A 64-bit hash of a run's request sizes in order; 0 is "unknown" (a run that was not hashed).
class fingerprint {
 public:
  static constexpr std::uint64_t unknown = 0;
  void add(std::size_t bytes) noexcept { hash_ = (hash_ + bytes) * 0x100000001B3ull; }
  [[nodiscard]] std::uint64_t value() const noexcept { return hash_ == 0 ? 1 : hash_; }

 private:
  std::uint64_t hash_ = 0;
};

/// How a key's run is served.
enum class run_kind : std::uint8_t {
  learn,  ///< a planned run: replays, records
  probe,  ///< the plain cache through the run's router, which only fingerprints
  pass,   ///< no router at all: the plain path
};

/// The detector of one key: the fingerprints of its last runs, which of them repeated, and its
/// mode and plan capacity. Guarded by the plan store's mutex.
class repeat_detector {
 public:
  /// Fingerprints kept (the reuse distances a key can see).
  static constexpr std::size_t ring = 64;
  /// Plans (and pending recordings) a key keeps at first; the capacity grows to follow a loop of
  /// more sequences, up to `ring`.
  static constexpr std::size_t first_capacity = 16;
  /// The planned requests a key's plans may hold at once, by which its capacity grows no further:
  /// a planned request takes about 264 B of host memory, so 2^18 are about 66 MiB a key.
  static constexpr std::size_t planned_requests_per_key = std::size_t{1} << 18;
  /// Runs in a window: learn -> pass when fewer than `min_repeats` of the last `window` runs in
  /// learn repeated; a probe window of `window` runs with `min_repeats` or more learns again.
  static constexpr unsigned window = 32;
  static constexpr unsigned min_repeats = 4;
  /// The first pass lasts `first_pass` runs; each probe window that finds no repeat doubles it,
  /// up to `longest_pass`.
  static constexpr std::uint64_t first_pass = 64;
  static constexpr std::uint64_t longest_pass = 4096;

  /// The kind of a run that begins when `runs` runs of the key have ended.
  [[nodiscard]] run_kind kind_at(std::uint64_t runs) const noexcept {
    if (!passing_) return run_kind::learn;
    return runs < pass_until_ ? run_kind::pass : run_kind::probe;
  }
  [[nodiscard]] bool passing() const noexcept { return passing_; }
  /// Plans the key keeps, and sequences it keeps pending: a run repeated when its fingerprint is
  /// among the last `capacity()` runs' (or it replayed a plan to its end).
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

  /// What a run's end changed. `grow`: the key's sequences come again, but further apart than its
  /// capacity (24 shapes in turn): it keeps more plans now and stays learning.
  enum class change : std::uint8_t { none, enter_pass, learn_again, grow };
  /// A run ended; `runs` counts it already. `fp`: its fingerprint (fingerprint::unknown when it
  /// was not hashed); `replayed`: it replayed a plan to its end; `longest_run`: the most requests
  /// a run of the key made (the capacity grows to at most planned_requests_per_key over it).
  change observe(std::uint64_t runs, std::uint64_t fp, bool replayed, std::size_t longest_run) noexcept;

 private:
  /// At the end of a window: a larger capacity, within the budget, that would make `min_repeats`
  /// or more of the window's far repeats near ones; 0 when none would.
  [[nodiscard]] std::size_t capacity_for_far_repeats() const noexcept;

  std::array<std::uint64_t, ring> fingerprints_{};  ///< a ring: the last `ring` runs', newest at next_ - 1
  /// Per run, in step with fingerprints_: how far back its fingerprint came before, where that
  /// was further than the capacity then (0: nearer, or not at all).
  std::array<std::uint8_t, ring> far_{};
  std::size_t next_ = 0;
  std::uint32_t repeats_ = 0;      ///< bit i: the run i runs ago repeated (the last 32 runs)
  std::uint32_t far_repeats_ = 0;  ///< bit i: the run i runs ago was a far repeat
  std::uint64_t runs_in_mode_ = 0;
  bool passing_ = false;
  std::uint64_t pass_until_ = 0;   ///< pass: runs below this pass, the next `window` probe
  std::uint64_t next_pass_ = first_pass;
  std::size_t capacity_ = first_capacity;
  std::size_t budget_run_ = 0;  ///< the longest run budget_ was computed for
  std::size_t budget_ = ring;   ///< planned_requests_per_key over it, within [first_capacity, ring]
};

}  // namespace refpool::detail
