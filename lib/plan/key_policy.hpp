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
/// mode. Guarded by the plan store's mutex.
class repeat_detector {
 public:
  /// Fingerprints kept (the reuse distances a key can see).
  static constexpr std::size_t ring = 64;
  /// A run repeated when its fingerprint is among the last `recent` runs' (the plans a key keeps),
  /// or it replayed a plan to its end.
  static constexpr std::size_t recent = 16;
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

  /// What a run's end changed.
  enum class change : std::uint8_t { none, enter_pass, learn_again };
  /// A run ended; `runs` counts it already. `fp`: its fingerprint (fingerprint::unknown when it
  /// was not hashed); `replayed`: it replayed a plan to its end.
  change observe(std::uint64_t runs, std::uint64_t fp, bool replayed) noexcept;

 private:
  std::array<std::uint64_t, ring> fingerprints_{};  ///< a ring: the last `ring` runs', newest at next_ - 1
  std::size_t next_ = 0;
  std::uint32_t repeats_ = 0;  ///< bit i: the run i runs ago repeated (the last 32 runs)
  std::uint64_t runs_in_mode_ = 0;
  bool passing_ = false;
  std::uint64_t pass_until_ = 0;   ///< pass: runs below this pass, the next `window` probe
  std::uint64_t next_pass_ = first_pass;
};

}  // namespace refpool::detail
