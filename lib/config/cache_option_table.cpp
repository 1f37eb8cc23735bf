// The cache options by name and as text, expanded from REFPOOL_CACHE_OPTIONS: setting one from
// REFPOOL_CONF's spelling, the defaults, and cache_options' text members.
#include "config/cache_option_table.hpp"

#include <string>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "config/conf_text.hpp"
#include "config/env_config.hpp"
#include "config/option_kinds.hpp"

namespace refpool {

namespace detail {

namespace {

template <class Kind>
typename Kind::type parse_or_throw(std::string_view what, std::string_view key, std::string_view text) {
  auto value = option_traits<Kind>::parse(text);
  if (!value)
    throw config_error(
        fmt::format("refpool: {} '{}' has value '{}'; allowed: {}", what, key, text, option_traits<Kind>::allowed));
  return *value;
}

}  // namespace

std::string_view cache_option_names() {
  // Never destroyed: configuration errors may come from static destructors.
  static const std::string& names = *new std::string([] {
    std::string joined;
#define REFPOOL_OPTION_NAME(kind, name, default_text, description) joined += joined.empty() ? #name : ", " #name;
    REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_NAME)
#undef REFPOOL_OPTION_NAME
    return joined;
  }());
  return names;
}

bool is_cache_option(std::string_view key) noexcept {
#define REFPOOL_OPTION_IS(kind, name, default_text, description) \
  if (key == #name) return true;
  REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_IS)
#undef REFPOOL_OPTION_IS
  return false;
}

void set_cache_option(cache_options& options, std::string_view key, std::string_view value, std::string_view what) {
#define REFPOOL_OPTION_SET(kind, name, default_text, description)       \
  if (key == #name) {                                                   \
    options.name = parse_or_throw<option_kind::kind>(what, key, value); \
    return;                                                             \
  }
  REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_SET)
#undef REFPOOL_OPTION_SET
  throw config_error(fmt::format("refpool: unknown cache option '{}'; cache options: {}", key, cache_option_names()));
}

rounding_policy parse_option(option_kind::rounding_policy, std::string_view key, std::string_view text) {
  return parse_or_throw<option_kind::rounding_policy>("cache option", key, text);
}

std::size_t parse_option(option_kind::byte_limit, std::string_view key, std::string_view text) {
  return parse_or_throw<option_kind::byte_limit>("cache option", key, text);
}

segment_policy parse_option(option_kind::segment_policy, std::string_view key, std::string_view text) {
  return parse_or_throw<option_kind::segment_policy>("cache option", key, text);
}

bool parse_option(option_kind::on_off, std::string_view key, std::string_view text) {
  return parse_or_throw<option_kind::on_off>("cache option", key, text);
}

}  // namespace detail

cache_options cache_options::from_environment() { return detail::environment().cache; }

cache_options cache_options::from_string(std::string_view conf) {
  cache_options options;
  options.apply(conf);
  return options;
}

void cache_options::apply(std::string_view conf) {
  cache_options changed = *this;  // all or nothing
  const auto set_one = [&](std::string_view key, std::string_view value) {
    if (detail::is_process_key(key))
      throw config_error(fmt::format(
          "refpool: conf key '{}' is process-wide: set it in REFPOOL_CONF, not per cache; cache options: {}", key,
          detail::cache_option_names()));
    detail::set_cache_option(changed, key, value, "cache option");
  };
  detail::for_each_conf_entry(conf, "conf", detail::cache_option_names(), set_one);
  *this = changed;
}

void cache_options::set(std::string_view key, std::string_view value) {
  detail::set_cache_option(*this, key, value, "cache option");
}

std::string cache_options::to_string() const {
  std::string out;
#define REFPOOL_OPTION_TEXT(kind, name, default_text, description) \
  out += fmt::format("{}" #name ":{}", out.empty() ? "" : ",",     \
                     detail::option_traits<detail::option_kind::kind>::format(name));
  REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_TEXT)
#undef REFPOOL_OPTION_TEXT
  return out;
}

}  // namespace refpool
