// Configuration read once from the environment: REFPOOL_CONF and REFPOOL_NO_CACHING.
#pragma once

#include <string>
#include <string_view>

#include <refpool/cache_options.hpp>

namespace refpool::detail {

class alloc_log;

/// What each cache prints to stderr when it is destroyed or the process exits (stats_at_exit).
enum class exit_stats { off, summary, full };

struct env_config {
  bool no_caching = false;                   ///< REFPOOL_NO_CACHING=on: every scope runs uncached
  cache_options cache;                       ///< the defaults with REFPOOL_CONF's cache options applied
  std::string log_path;                      ///< REFPOOL_CONF log:<file>
  exit_stats stats_at_exit = exit_stats::off;  ///< REFPOOL_CONF stats_at_exit:on (summary) or full
};

/// Parses REFPOOL_CONF's text ("key:value,key:value"): the cache options
/// (refpool/cache_option_fields.h) and the process-wide keys. Throws `config_error` naming the key
/// and its allowed values.
env_config parse_conf(std::string_view conf);
/// Whether `key` is one of REFPOOL_CONF's process-wide keys (log, stats_at_exit), which no cache's
/// conf string may set.
bool is_process_key(std::string_view key) noexcept;
/// Parses REFPOOL_NO_CACHING's value: "" (off) or a switch (on, off; option_kinds.hpp's parse_switch).
bool parse_no_caching(std::string_view value);

/// The process's configuration, read on first use. Throws `config_error` (at each use) while
/// the environment holds a bad value.
const env_config& environment();
/// Set once, while environment() is first read; never changed after.
extern alloc_log* log_pointer;
/// The allocation log, or null when REFPOOL_CONF has no log key. Valid once environment() ran.
inline alloc_log* active_log() noexcept { return log_pointer; }

}  // namespace refpool::detail
