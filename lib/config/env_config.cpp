// REFPOOL_CONF and REFPOOL_NO_CACHING: parsed once, with errors that name key and values.
#include "env_config.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <refpool/error.hpp>

#include "alloc_log.hpp"
#include "config/cache_option_table.hpp"
#include "config/conf_text.hpp"
#include "config/option_kinds.hpp"

namespace refpool::detail {

namespace {

// REFPOOL_CONF's keys besides the cache options: they set up the process, not a cache.
constexpr std::array<std::string_view, 2> process_keys{"log", "stats_at_exit"};

std::string known_keys() { return fmt::format("{}, {}", cache_option_names(), fmt::join(process_keys, ", ")); }

exit_stats parse_exit_stats(std::string_view value) {
  if (const auto on = parse_switch(value)) return *on ? exit_stats::summary : exit_stats::off;
  if (same_letters(value, "full")) return exit_stats::full;
  throw config_error(fmt::format(
      "refpool: REFPOOL_CONF key 'stats_at_exit' has value '{}'; allowed: on (a summary), full (every counter), off",
      value));
}

env_config load() {
  env_config config;
  if (const char* conf = std::getenv("REFPOOL_CONF")) config = parse_conf(conf);
  if (const char* no_caching = std::getenv("REFPOOL_NO_CACHING")) config.no_caching = parse_no_caching(no_caching);
  return config;
}

}  // namespace

alloc_log* log_pointer = nullptr;

bool is_process_key(std::string_view key) noexcept {
  return std::find(process_keys.begin(), process_keys.end(), key) != process_keys.end();
}

env_config parse_conf(std::string_view conf) {
  env_config config;
  for_each_conf_entry(conf, "REFPOOL_CONF", known_keys(), [&](std::string_view key, std::string_view value) {
    if (is_cache_option(key)) {
      set_cache_option(config.cache, key, value, "REFPOOL_CONF key");
    } else if (key == "log") {
      if (value.empty()) throw config_error("refpool: REFPOOL_CONF key 'log' has value ''; allowed: a file path");
      config.log_path = value;
    } else if (key == "stats_at_exit") {
      config.stats_at_exit = parse_exit_stats(value);
    } else {
      throw config_error(fmt::format("refpool: REFPOOL_CONF has unknown key '{}'; keys: {}", key, known_keys()));
    }
  });
  return config;
}

bool parse_no_caching(std::string_view value) {
  if (value.empty()) return false;
  if (const auto on = parse_switch(value)) return *on;
  throw config_error(fmt::format("refpool: REFPOOL_NO_CACHING has value '{}'; allowed: on, off", value));
}

const env_config& environment() {
  // Never destroyed (nor the log closed): requests and frees may come from static destructors
  // until the process ends, also from those of objects made before the first use of this one.
  static const env_config& config = *[] {
    auto* loaded = new env_config(load());
    if (!loaded->log_path.empty()) log_pointer = new alloc_log(loaded->log_path);
    return loaded;
  }();
  return config;
}

}  // namespace refpool::detail
