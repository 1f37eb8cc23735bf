// Rounding for the segment heap, with every overflow turned into a size_error.
#pragma once

#include <cstddef>
#include <cstdint>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

/// `bytes` rounded up to a multiple of `unit` (> 0); the caller knows it cannot overflow.
constexpr std::size_t round_up(std::size_t bytes, std::size_t unit) noexcept {
  return (bytes + unit - 1) / unit * unit;
}

/// `bytes` rounded up to a multiple of `unit` (> 0); `size_error` naming `unit_name` if the
/// result does not fit in size_t.
inline std::size_t checked_round_up(std::size_t bytes, std::size_t unit, const char* unit_name) {
  if (bytes > SIZE_MAX - (unit - 1))
    throw size_error(fmt::format("refpool: {} B cannot be rounded up to the {} of {} B without overflowing size_t",
                                 bytes, unit_name, unit));
  return round_up(bytes, unit);
}

}  // namespace refpool::detail
