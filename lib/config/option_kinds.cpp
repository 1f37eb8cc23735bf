// How each kind of cache option is spelled and carried in C (see option_kinds.hpp).
#include "config/option_kinds.hpp"

#include <array>
#include <charconv>
#include <utility>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

namespace {

std::optional<std::size_t> parse_number(std::string_view text) {
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// Binary multiples, largest first (format picks the largest that divides exactly).
constexpr std::array<std::pair<char, unsigned>, 4> byte_suffixes{{{'T', 40}, {'G', 30}, {'M', 20}, {'K', 10}}};

}  // namespace

bool same_letters(std::string_view text, std::string_view lower) noexcept {
  if (text.size() != lower.size()) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i] >= 'A' && text[i] <= 'Z' ? static_cast<char>(text[i] - 'A' + 'a') : text[i];
    if (c != lower[i]) return false;
  }
  return true;
}

std::optional<bool> parse_switch(std::string_view text) noexcept {
  for (const std::string_view on : {"on", "true", "yes", "1"})
    if (same_letters(text, on)) return true;
  for (const std::string_view off : {"off", "false", "no", "0"})
    if (same_letters(text, off)) return false;
  return std::nullopt;
}

// ---- rounding_policy: exact, step:<bytes>, pow2, pow2:<divisions> --------------------------------

std::optional<rounding_policy> option_traits<option_kind::rounding_policy>::parse(std::string_view text) {
  if (text == "exact") return rounding_policy::exact();
  if (text == "pow2") return rounding_policy::pow2(1);
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const auto mode = text.substr(0, colon);
  const auto number = parse_number(text.substr(colon + 1));
  if (!number) return std::nullopt;
  try {  // the factories check the parameter (and throw config_error for a bad one)
    if (mode == "step") return rounding_policy::step(*number);
    if (mode == "pow2" && *number <= 64) return rounding_policy::pow2(static_cast<unsigned>(*number));
  } catch (const config_error&) {}
  return std::nullopt;
}

std::string option_traits<option_kind::rounding_policy>::format(const rounding_policy& value) {
  return value.to_string();
}

refpool_rounding_policy option_traits<option_kind::rounding_policy>::to_c(const rounding_policy& value) {
  switch (value.policy_mode()) {
    case rounding_policy::mode::exact: return {REFPOOL_ROUNDING_EXACT, 1};
    case rounding_policy::mode::step: return {REFPOOL_ROUNDING_STEP, value.parameter()};
    case rounding_policy::mode::pow2_divisions: return {REFPOOL_ROUNDING_POW2, value.parameter()};
  }
  return {REFPOOL_ROUNDING_EXACT, 1};
}

std::string option_traits<option_kind::rounding_policy>::c_text(const refpool_rounding_policy& value) {
  switch (value.mode) {
    case REFPOOL_ROUNDING_EXACT: return "exact";
    case REFPOOL_ROUNDING_STEP: return fmt::format("step:{}", value.parameter);
    case REFPOOL_ROUNDING_POW2: return fmt::format("pow2:{}", value.parameter);
  }
  return fmt::format("mode {}", static_cast<int>(value.mode));  // no such mode: parse rejects it
}

// ---- byte_limit: <bytes>[K|M|G|T], unlimited ---------------------------------------------------

std::optional<std::size_t> option_traits<option_kind::byte_limit>::parse(std::string_view text) {
  if (text == "unlimited") return cache_options::unlimited;
  unsigned shift = 0;
  for (const auto& [suffix, bits] : byte_suffixes) {
    if (!text.empty() && text.back() == suffix) {
      shift = bits;
      text.remove_suffix(1);
      break;
    }
  }
  const auto number = parse_number(text);
  std::size_t bytes = 0;
  if (!number || __builtin_mul_overflow(*number, std::size_t{1} << shift, &bytes)) return std::nullopt;
  return bytes;
}

std::string option_traits<option_kind::byte_limit>::format(std::size_t value) {
  if (value == cache_options::unlimited) return "unlimited";
  for (const auto& [suffix, bits] : byte_suffixes) {
    const std::size_t unit = std::size_t{1} << bits;
    if (value != 0 && value % unit == 0) return fmt::format("{}{}", value / unit, suffix);
  }
  return fmt::format("{}", value);
}

// ---- segment_policy: off, on, auto ------------------------------------------------------------

std::optional<segment_policy> option_traits<option_kind::segment_policy>::parse(std::string_view text) {
  if (same_letters(text, "auto")) return segment_policy::automatic;
  if (const auto on = parse_switch(text)) return *on ? segment_policy::on : segment_policy::off;
  return std::nullopt;
}

std::string option_traits<option_kind::segment_policy>::format(segment_policy value) {
  switch (value) {
    case segment_policy::off: return "off";
    case segment_policy::on: return "on";
    case segment_policy::automatic: return "auto";
  }
  return "auto";
}

refpool_segment_policy option_traits<option_kind::segment_policy>::to_c(segment_policy value) {
  switch (value) {
    case segment_policy::off: return REFPOOL_SEGMENTS_OFF;
    case segment_policy::on: return REFPOOL_SEGMENTS_ON;
    case segment_policy::automatic: return REFPOOL_SEGMENTS_AUTO;
  }
  return REFPOOL_SEGMENTS_AUTO;
}

std::string option_traits<option_kind::segment_policy>::c_text(refpool_segment_policy value) {
  switch (value) {
    case REFPOOL_SEGMENTS_AUTO: return "auto";
    case REFPOOL_SEGMENTS_OFF: return "off";
    case REFPOOL_SEGMENTS_ON: return "on";
  }
  return fmt::format("{}", static_cast<int>(value));  // no such policy: parse rejects it
}

// ---- on_off: on, off ----------------------------------------------------------------------------

std::optional<bool> option_traits<option_kind::on_off>::parse(std::string_view text) { return parse_switch(text); }

std::string option_traits<option_kind::on_off>::c_text(refpool_on_off value) {
  switch (value) {
    case REFPOOL_OFF: return "off";
    case REFPOOL_ON: return "on";
  }
  return fmt::format("{}", static_cast<int>(value));  // neither: parse rejects it
}

}  // namespace refpool::detail
