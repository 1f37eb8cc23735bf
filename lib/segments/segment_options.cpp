// choose_piece_unit: whether a segment heap can serve a backend, and its piece unit.
#include "segment_options.hpp"

#include <algorithm>
#include <bit>
#include <utility>

#include <fmt/format.h>

namespace refpool::detail {

piece_unit_choice choose_piece_unit(std::size_t alignment, const segment_heap_options& o) {
  const auto refused = [](std::string why) { return piece_unit_choice{0, "refpool: segment heap: " + why}; };
  const auto power_of_two = [](std::size_t v) { return v != 0 && std::has_single_bit(v); };
  if (!power_of_two(o.piece_granularity))
    return refused(fmt::format("piece granularity {} B is not a power of two", o.piece_granularity));
  if (!power_of_two(alignment)) return refused(fmt::format("backend alignment {} B is not a power of two", alignment));
  const std::size_t unit = std::max(o.piece_granularity, alignment);
  if (o.small_max == 0 || o.small_max > o.small_segment)
    return refused(
        fmt::format("option small_max = {} B must be in [1, small_segment = {} B]", o.small_max, o.small_segment));
  if (unit > o.small_max)
    return refused(
        fmt::format("a piece unit of {} B (the backend's alignment) is larger than small_max = {} B: "
                    "every small request would cost a whole unit",
                    unit, o.small_max));
  const std::pair<std::size_t, const char*> sizes[] = {
      {o.small_segment, "small_segment"}, {o.large_segment, "large_segment"}, {o.segment_rounding, "segment_rounding"}};
  for (const auto& [value, name] : sizes)
    if (value == 0 || value % unit != 0)
      return refused(
          fmt::format("option {} = {} B is not a positive multiple of the {} B piece unit", name, value, unit));
  if (o.growth_divisor == 0) return refused("option growth_divisor must be at least 1");
  return piece_unit_choice{unit, {}};
}

}  // namespace refpool::detail
