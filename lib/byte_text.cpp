// Byte counts for people (byte_text.hpp).
#include "byte_text.hpp"

#include <array>

#include <fmt/format.h>

namespace refpool::detail {

std::string scaled_bytes(std::size_t bytes) {
  static constexpr std::array<const char*, 7> units{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t unit = 0;
  while (unit + 1 < units.size() && (bytes >> (10 * (unit + 1))) != 0) ++unit;
  if (unit == 0) return fmt::format("{} B", bytes);
  const std::size_t whole = bytes >> (10 * unit);
  if ((whole << (10 * unit)) == bytes) return fmt::format("{} {}", whole, units[unit]);
  const double value = static_cast<double>(bytes) / static_cast<double>(std::size_t{1} << (10 * unit));
  // Three significant digits; rounding may reach 1024 of a unit ("1024 KiB"), which still reads right.
  const int decimals = value < 10 ? 2 : value < 100 ? 1 : 0;
  return fmt::format("{:.{}f} {}", value, decimals, units[unit]);
}

}  // namespace refpool::detail
