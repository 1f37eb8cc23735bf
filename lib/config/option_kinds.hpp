// The kinds of cache options (refpool/cache_option_fields.h): for each, its spelling as text, its
// C type, and the conversions. The only place that knows how a kind is spelled; everything that
// handles options by name (conf strings, REFPOOL_CONF, the C API, Python) goes through these.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <refpool/cache_options.hpp>
#include <refpool/refpool.h>

namespace refpool::detail {

/// A switch from its usual spellings: on/off, true/false, yes/no, 1/0, in any case; nullopt for any
/// other text. Every switch (on_off options, segments' on and off, stats_at_exit,
/// REFPOOL_NO_CACHING) reads through here; docs and errors spell it on/off.
[[nodiscard]] std::optional<bool> parse_switch(std::string_view text) noexcept;
/// Whether `text` is `lower` (a lower-case word) in any case: a keyword's spelling ("auto", "full").
[[nodiscard]] bool same_letters(std::string_view text, std::string_view lower) noexcept;

/// Per kind: `type` (C++), `c_type`, `allowed` (the text values, for errors and bindings),
/// `allowed_c` (the same in C's terms), and
///   parse(text)  -> the value, or nullopt when the text is not one of `allowed`;
///   format(v)    -> the text, which parse reads back as v;
///   to_c(v)      -> the C value;
///   c_text(c)    -> the text a C value stands for, which parse rejects when the C value is bad.
template <class Kind>
struct option_traits;

template <>
struct option_traits<option_kind::rounding_policy> {
  using type = rounding_policy;
  using c_type = refpool_rounding_policy;
  static constexpr std::string_view allowed =
      "exact, step:<bytes> (e.g. step:512), pow2, pow2:<divisions 1..64, a power of two>";
  static constexpr std::string_view allowed_c =
      "{REFPOOL_ROUNDING_EXACT, any}, {REFPOOL_ROUNDING_STEP, bytes > 0}, "
      "{REFPOOL_ROUNDING_POW2, divisions: a power of two from 1 to 64}";
  static std::optional<type> parse(std::string_view text);
  static std::string format(const type& value);
  static c_type to_c(const type& value);
  static std::string c_text(const c_type& value);
};

template <>
struct option_traits<option_kind::byte_limit> {
  using type = std::size_t;
  using c_type = refpool_byte_limit;
  static constexpr std::string_view allowed = "a byte count, optionally with K, M, G or T (e.g. 512M), or unlimited";
  static constexpr std::string_view allowed_c = "any size_t (REFPOOL_UNLIMITED: no limit)";
  static std::optional<type> parse(std::string_view text);
  static std::string format(type value);
  static c_type to_c(type value) { return value; }
  static std::string c_text(c_type value) { return format(value); }
};

template <>
struct option_traits<option_kind::segment_policy> {
  using type = segment_policy;
  using c_type = refpool_segment_policy;
  static constexpr std::string_view allowed = "off, on, auto";
  static constexpr std::string_view allowed_c =
      "REFPOOL_SEGMENTS_AUTO (0), REFPOOL_SEGMENTS_OFF (1), REFPOOL_SEGMENTS_ON (2)";
  static std::optional<type> parse(std::string_view text);
  static std::string format(type value);
  static c_type to_c(type value);
  static std::string c_text(c_type value);
};

template <>
struct option_traits<option_kind::on_off> {
  using type = bool;
  using c_type = refpool_on_off;
  static constexpr std::string_view allowed = "on, off";
  static constexpr std::string_view allowed_c = "REFPOOL_OFF (0), REFPOOL_ON (1)";
  static std::optional<type> parse(std::string_view text);
  static std::string format(type value) { return value ? "on" : "off"; }
  static c_type to_c(type value) { return value ? REFPOOL_ON : REFPOOL_OFF; }
  static std::string c_text(c_type value);
};

}  // namespace refpool::detail
