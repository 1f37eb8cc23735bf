// Spans in every fuzz input (lib/segments/span.hpp; docs/segments.md, "One memory space"): a segment
// heap of its own, over a limited host backend with faults, whose pieces and spans the input's
// operations drive beside the segment cache (segment_shadow.hpp drives both; sizes and choices
// follow a hash of the seed and the operation's number, as there; one operation in eight drives it,
// which keeps its share of the fuzzer's time small). Spans are what plan arenas
// become in issue 36: until the plan side uses them, this is where the fuzzer meets them. Checked by
// properties after every operation it takes part in (the stamps after every fourth):
//   - no two pieces or placed spans overlap, and they are exactly the heap's ranges in use;
//   - every piece and every placed span (held or idle) keeps its owner's stamps: nothing else wrote
//     or decommitted them; a span held again at home after a yield is stamped afresh;
//   - bytes are exact: pieces + spans + free = committed = what the backend holds;
//   - the heap's own invariants (segment_heap::check), and the span records against its ranges;
//   - failures are out of memory (nullopt) or the injected backend_error, and change nothing;
//   - at the end, everything given back, nothing is left with the backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <refpool/refpool.hpp>

#include "support/fault_injection.hpp"
#include "segments/segment_heap.hpp"

namespace refpool::test::fuzz {

/// A 64-bit mix (splitmix64's): the shadows' sizes, streams and stamps from the seed and an operation's number.
inline std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class span_shadow {
 public:
  explicit span_shadow(std::uint64_t seed);
  span_shadow(const span_shadow&) = delete;
  span_shadow& operator=(const span_shadow&) = delete;
  ~span_shadow();

  /// One operation of kind `op` (the harness's table index), as operation `n`.
  void step(std::size_t op, std::uint64_t n);
  /// Gives everything back and checks that the backend got every byte back.
  void finish();

 private:
  struct owned {
    detail::segment_heap::piece piece;  ///< a piece's bytes
    detail::segment_span* span = nullptr;  ///< or a span (its bytes while placed)
    bool holding = false;                  ///< a span its owner holds: the heap must never yield it
    std::uint64_t stamp = 0;
  };
  static constexpr std::size_t places = 12;

  [[nodiscard]] detail::segment_heap::piece bytes_of(const owned& o) const;
  void write_stamp(const owned& o) const;
  void verify(const owned& o, const char* when) const;
  void drop(owned& o);
  void check(bool stamps);  ///< stamps: verify every owner's stamps too

  std::uint64_t seed_;
  std::shared_ptr<refpool::failing_resource> failing_;
  refpool::backend be_;
  std::unique_ptr<detail::segment_heap> heap_;
  std::uint64_t next_stamp_ = 0;
  owned owned_[places];
};

/// One line of counts over every input run in this process (what the span heaps did).
void print_span_totals();
/// Empty when the span heaps yielded spans, held one again at home and grew one in place; else
/// what they never did.
std::string missing_span_coverage();

}  // namespace refpool::test::fuzz
