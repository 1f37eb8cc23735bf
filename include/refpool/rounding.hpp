// How a cache rounds request sizes into block sizes (and so into cache keys).
#pragma once

#include <cstddef>
#include <string>

#include <refpool/detail/export.hpp>

namespace refpool {

/// Rounding of requested bytes to block bytes. Exact by default: a block is reused only for
/// requests of its byte size. Coarser policies trade memory for hits on varied sizes.
class REFPOOL_API rounding_policy {
 public:
  enum class mode { exact, step, pow2_divisions };

  /// Blocks have exactly the requested size.
  static constexpr rounding_policy exact() noexcept { return {mode::exact, 1}; }
  /// Round up to a multiple of `bytes` (> 0), e.g. 512 as CUB and PyTorch do for small blocks.
  static rounding_policy step(std::size_t bytes);
  /// Split each interval [2^k, 2^(k+1)) into `divisions` (a power of two, 1..64) equal steps
  /// and round up to the next step (PyTorch's roundup_power2_divisions); 1 = next power of two.
  static rounding_policy pow2(unsigned divisions = 1);

  /// `bytes` rounded up. Throws `size_error` if the result overflows std::size_t.
  [[nodiscard]] std::size_t round(std::size_t bytes) const { return mode_ == mode::exact ? bytes : round_up(bytes); }

  [[nodiscard]] mode policy_mode() const noexcept { return mode_; }
  /// Step bytes (step mode) or divisions (pow2 mode); 1 for exact.
  [[nodiscard]] std::size_t parameter() const noexcept { return parameter_; }
  /// "exact", "step:512", "pow2:4".
  [[nodiscard]] std::string to_string() const;

  friend bool operator==(const rounding_policy&, const rounding_policy&) = default;

 private:
  [[nodiscard]] std::size_t round_up(std::size_t bytes) const;
  constexpr rounding_policy(mode m, std::size_t parameter) noexcept : mode_(m), parameter_(parameter) {}
  mode mode_;
  std::size_t parameter_;
};

}  // namespace refpool
