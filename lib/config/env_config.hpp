// Configuration read once from the environment: REFPOOL_CONF and REFPOOL_NO_CACHING.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <refpool/alloc_cache.hpp>
#include <refpool/rounding.hpp>

namespace refpool::detail {

class alloc_log;

struct env_config {
  bool no_caching = false;                  ///< REFPOOL_NO_CACHING=1: every scope runs uncached
  std::optional<rounding_policy> rounding;  ///< REFPOOL_CONF rounding:...
  std::optional<std::size_t> max_idle_bytes;
  std::optional<segment_policy> segments;   ///< REFPOOL_CONF segments:off|on|auto
  std::string log_path;                     ///< REFPOOL_CONF log:<file>
  bool stats_at_exit = false;               ///< REFPOOL_CONF stats_at_exit:1
};

/// Parses REFPOOL_CONF's text ("key:value,key:value"). Throws `config_error` naming the key and
/// its allowed values.
env_config parse_conf(std::string_view conf);
/// Parses REFPOOL_NO_CACHING's value ("", "0" or "1").
bool parse_no_caching(std::string_view value);

/// The process's configuration, read on first use. Throws `config_error` (at each use) while
/// the environment holds a bad value.
const env_config& environment();
/// Set once, while environment() is first read; never changed after.
extern alloc_log* log_pointer;
/// The allocation log, or null when REFPOOL_CONF has no log key. Valid once environment() ran.
inline alloc_log* active_log() noexcept { return log_pointer; }

}  // namespace refpool::detail
