// Size arithmetic of plans, checked for wrap-around: a placement or rounding that would wrap
// throws size_error instead of handing out a tiny region for a huge request.
#pragma once

#include <cstddef>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

/// a + b, or size_error naming `what`.
inline std::size_t checked_add(std::size_t a, std::size_t b, const char* what) {
  std::size_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum))
    throw size_error(fmt::format("refpool: {}: {} B + {} B overflows size_t", what, a, b));
  return sum;
}

/// `bytes` rounded up to a multiple of `alignment` (> 0), or size_error naming `what`.
inline std::size_t checked_round_up(std::size_t bytes, std::size_t alignment, const char* what) {
  const std::size_t rest = bytes % alignment;
  return rest == 0 ? bytes : checked_add(bytes, alignment - rest, what);
}

}  // namespace refpool::detail
