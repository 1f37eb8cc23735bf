// A third cache in every fuzz input, with segments on (docs/design.md, "Segments"), checked by
// properties rather than by the model: the model describes the exact-key cache that host
// backends get by default, and the segment heap's own randomized model test covers carving
// byte by byte. Each decoded operation also drives one operation here (its kind follows the
// input's operation code; sizes, streams and handles follow a hash of the input's seed and the
// operation's number, so the input's bytes keep their meaning for the model). After each one
// (the accounting after every eighth, and at the end):
//   - no two live pieces overlap;
//   - byte accounting is exact: backend outstanding = held + segment free bytes = reserved,
//     the bytes of pieces out = held bytes, the limit adaptor agrees, live blocks and bytes are
//     the handles';
//   - every live piece still carries its owner's stamps (checked before it is dropped, and on
//     verify operations);
//   - requests fail only with out_of_memory, or backend_error carrying the injected code;
//   - the heaps' own invariants (check_segments): ranges tile the committed bytes around the
//     holes trims leave, and a trim that gave back all it could left no free whole commit;
//   - at the end, nothing is left with the backend.
// Some operations run a short training loop instead (training_loop): steps without a plan key
// whose request sequences repeat, so automatic plans, their arenas, an idle arena lent to a step
// with a new sequence, and that sequence's adoption run under the same checks. Each operation also
// drives a heap with spans of its own (span_shadow.hpp), checked the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <refpool/refpool.hpp>
#include "support/fault_injection.hpp"

#include "span_shadow.hpp"

namespace refpool::test::fuzz {

class segment_shadow {
 public:
  /// Runs `job` on thread `t` (0: the caller, 1: the harness's helper thread).
  using runner = std::function<void(int t, const std::function<void()>& job)>;

  segment_shadow(std::uint64_t seed, runner run_on);
  segment_shadow(const segment_shadow&) = delete;
  segment_shadow& operator=(const segment_shadow&) = delete;
  ~segment_shadow();

  /// One operation of kind `op` (the harness's table index) on thread `t`, as operation `n`.
  void step(std::size_t op, int t, std::uint64_t n);
  /// Drops everything, destroys the cache, and checks that the backend got every byte back.
  void finish();

 private:
  struct piece {
    refpool::data_ref ref;
    std::uint64_t stamp = 0;
    std::uint64_t generation = 0;  ///< which cache handed it out (recreate makes a new one)
  };
  static constexpr int slots = 16;

  void allocate(int t, std::size_t slot, std::uint64_t h);
  /// `ref` from a request of `bytes` on `stream` (thread `t`), or empty (out of memory, injected).
  refpool::data_ref request(int t, std::size_t bytes, refpool::stream_ref stream);
  /// Stamps `made` as a fresh piece of this cache.
  void start_piece(piece& made);
  /// Fails if `made` overlaps a live piece of the slots or of `others` (itself aside).
  void check_apart(const piece& made, const std::vector<piece>& others) const;
  /// Runs 3-6 steps, each one of the input's four request sequences (mostly the first).
  void training_loop(int t, std::uint64_t h);
  void drop(std::size_t slot, const char* when);
  /// Gives `p` a new owner's pattern (its low 28 bits left for each word's offset) and writes it.
  void restamp(piece& p);
  void stamp(const piece& p);
  void verify(const piece& p, const char* when) const;
  void check(bool with_stats);
  void recreate();
  void add_totals() const;

  std::uint64_t seed_;
  runner run_on_;
  std::shared_ptr<refpool::byte_budget> budget_;  ///< the limit's; training loops raise it
  std::shared_ptr<refpool::limiting_resource> limited_;
  std::shared_ptr<refpool::failing_resource> failing_;
  refpool::backend be_;
  std::unique_ptr<refpool::alloc_cache> cache_;
  std::unique_ptr<refpool::step> step_;
  std::uint64_t generation_ = 0;
  std::uint64_t next_stamp_ = 0;
  piece pieces_[slots];
  span_shadow spans_;  ///< spans, on a heap of their own
};

/// One line of counts over every input run in this process (what the shadow caches and span heaps did).
void print_segment_totals();
/// Empty when the shadow caches' training loops made plans, hit their regions and lent an
/// arena, and the span heaps met every span path (missing_span_coverage); else what they never did
/// (the fuzzer would no longer cover that policy).
std::string missing_segment_coverage();

}  // namespace refpool::test::fuzz
