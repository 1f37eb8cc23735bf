// `fmt::format("{}", stats)` for cache_stats: the table of refpool::to_string. Separate from
// stats.hpp so that the public headers need fmt only where this one is included.
#pragma once

#include <string_view>

#include <fmt/format.h>

#include <refpool/stats.hpp>

template <>
struct fmt::formatter<refpool::cache_stats> : fmt::formatter<std::string_view> {
  template <class FormatContext>
  auto format(const refpool::cache_stats& stats, FormatContext& ctx) const {
    const std::string text = refpool::to_string(stats);
    return fmt::formatter<std::string_view>::format(text, ctx);
  }
};
