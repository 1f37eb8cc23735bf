// REFPOOL_CONF and REFPOOL_NO_CACHING: parsed once, with errors that name key and values.
#include "env_config.hpp"

#include <charconv>
#include <cstdlib>
#include <memory>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "alloc_log.hpp"

namespace refpool::detail {

namespace {

constexpr std::string_view known_keys = "rounding, max_idle_bytes, segments, log, stats_at_exit";

[[noreturn]] void bad_value(std::string_view key, std::string_view value, std::string_view allowed) {
  throw config_error(fmt::format("refpool: REFPOOL_CONF key '{}' has value '{}'; allowed: {}", key, value,
                                 allowed));
}

std::optional<std::size_t> parse_number(std::string_view text) {
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// "1024", "64K", "512M", "2G", "1T" (binary multiples).
std::optional<std::size_t> parse_bytes(std::string_view text) {
  std::size_t multiplier = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K': multiplier = std::size_t{1} << 10; break;
      case 'M': multiplier = std::size_t{1} << 20; break;
      case 'G': multiplier = std::size_t{1} << 30; break;
      case 'T': multiplier = std::size_t{1} << 40; break;
      default: break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  const auto number = parse_number(text);
  std::size_t bytes = 0;
  if (!number || __builtin_mul_overflow(*number, multiplier, &bytes)) return std::nullopt;
  return bytes;
}

rounding_policy parse_rounding(std::string_view value) {
  constexpr std::string_view allowed = "exact, step:<bytes> (e.g. step:512), pow2, pow2:<divisions 1..64, a power of two>";
  if (value == "exact") return rounding_policy::exact();
  if (value == "pow2") return rounding_policy::pow2(1);
  const auto colon = value.find(':');
  if (colon == std::string_view::npos) bad_value("rounding", value, allowed);
  const auto kind = value.substr(0, colon);
  const auto number = parse_number(value.substr(colon + 1));
  if (!number) bad_value("rounding", value, allowed);
  try {
    if (kind == "step") return rounding_policy::step(*number);
    if (kind == "pow2" && *number <= 64) return rounding_policy::pow2(static_cast<unsigned>(*number));
  } catch (const config_error&) {
  }
  bad_value("rounding", value, allowed);
}

segment_policy parse_segments(std::string_view value) {
  if (value == "off") return segment_policy::off;
  if (value == "on") return segment_policy::on;
  if (value == "auto") return segment_policy::automatic;
  bad_value("segments", value, "off, on, auto");
}

bool parse_flag(std::string_view key, std::string_view value) {
  if (value == "1" || value == "true") return true;
  if (value == "0" || value == "false") return false;
  bad_value(key, value, "0, 1, true, false");
}

env_config load() {
  env_config config;
  if (const char* conf = std::getenv("REFPOOL_CONF")) config = parse_conf(conf);
  if (const char* no_caching = std::getenv("REFPOOL_NO_CACHING")) config.no_caching = parse_no_caching(no_caching);
  return config;
}

}  // namespace

alloc_log* log_pointer = nullptr;

env_config parse_conf(std::string_view conf) {
  env_config config;
  while (!conf.empty()) {
    const auto comma = conf.find(',');
    const auto item = conf.substr(0, comma);
    conf = comma == std::string_view::npos ? std::string_view{} : conf.substr(comma + 1);
    if (item.empty()) continue;
    const auto colon = item.find(':');
    if (colon == std::string_view::npos)
      throw config_error(fmt::format("refpool: REFPOOL_CONF entry '{}' is not key:value; keys: {}", item, known_keys));
    const auto key = item.substr(0, colon);
    const auto value = item.substr(colon + 1);
    if (key == "rounding") {
      config.rounding = parse_rounding(value);
    } else if (key == "max_idle_bytes") {
      config.max_idle_bytes = parse_bytes(value);
      if (!config.max_idle_bytes) bad_value(key, value, "a byte count, optionally with K, M, G or T (e.g. 512M)");
    } else if (key == "segments") {
      config.segments = parse_segments(value);
    } else if (key == "log") {
      if (value.empty()) bad_value(key, value, "a file path");
      config.log_path = value;
    } else if (key == "stats_at_exit") {
      config.stats_at_exit = parse_flag(key, value);
    } else {
      throw config_error(fmt::format("refpool: REFPOOL_CONF has unknown key '{}'; keys: {}", key, known_keys));
    }
  }
  return config;
}

bool parse_no_caching(std::string_view value) {
  if (value.empty() || value == "0") return false;
  if (value == "1") return true;
  throw config_error(fmt::format("refpool: REFPOOL_NO_CACHING has value '{}'; allowed: 0, 1", value));
}

const env_config& environment() {
  static const env_config config = [] {
    env_config loaded = load();
    // Never closed: frees may be logged by static destructors until the process ends.
    if (!loaded.log_path.empty()) log_pointer = new alloc_log(loaded.log_path);
    return loaded;
  }();
  return config;
}

}  // namespace refpool::detail
