// `cache_options`: the tunables of one cache, generated from refpool/cache_option_fields.h, and
// their text form, which is REFPOOL_CONF's (docs/design.md, "Configuration").
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <refpool/cache_option_fields.h>
#include <refpool/detail/export.hpp>
#include <refpool/rounding.hpp>

namespace refpool {

/// Whether a cache serves a miss by carving a piece out of a larger segment (best fit, split,
/// coalesced again when pieces are freed; segments grow through virtual memory where the backend
/// has it) or by one backend allocation per block. Either way an idle block of exactly the
/// request's key is a hit first, and every piece is a block with its own reference count
/// (docs/design.md, "Segments"). Spelled `off`, `on`, `auto`.
enum class segment_policy : std::uint8_t {
  /// One backend allocation per block: a block only ever serves its own (rounded) size.
  off,
  /// Segments for every backend: grown through `resource::address_space()` where the backend
  /// has one, else made of backend allocations. Pieces of one backend's segments may share one
  /// physical allocation, so a buffer that must be exported for IPC or registered with NCCL or
  /// RDMA as its own allocation needs a cache with `off`.
  on,
  /// `on` for backends of device memory (`memory_kind::device`) whose resource offers virtual
  /// memory (GPUs: driver allocations are costly and fragment), `off` for the rest: host
  /// memory (malloc already splits and coalesces), stream-ordered `device_async` memory (the
  /// driver's pool already sub-allocates) and resources without virtual memory.
  automatic,
};

namespace detail::option_kind {
// The kinds of REFPOOL_CACHE_OPTIONS: each names the C++ type of its options. The rest of a kind
// (its spelling, its C type) is in lib/config/option_kinds.hpp.
struct rounding_policy {
  using type = refpool::rounding_policy;
};
/// A byte count; `unlimited` is SIZE_MAX.
struct byte_limit {
  using type = std::size_t;
};
struct segment_policy {
  using type = refpool::segment_policy;
};
/// A switch, spelled `on` or `off`.
struct on_off {
  using type = bool;
};
}  // namespace detail::option_kind

namespace detail {
/// The value `text` spells for an option of the kind, for the defaults below. Throws
/// `config_error` naming `key` and the allowed values.
[[nodiscard]] REFPOOL_API rounding_policy parse_option(option_kind::rounding_policy, std::string_view key,
                                                       std::string_view text);
[[nodiscard]] REFPOOL_API std::size_t parse_option(option_kind::byte_limit, std::string_view key,
                                                   std::string_view text);
[[nodiscard]] REFPOOL_API segment_policy parse_option(option_kind::segment_policy, std::string_view key,
                                                      std::string_view text);
[[nodiscard]] REFPOOL_API bool parse_option(option_kind::on_off, std::string_view key, std::string_view text);
}  // namespace detail

/// Tunables of one cache: one field per option of refpool/cache_option_fields.h, which says what
/// each does and its default (`rounding`: exact, `max_idle_bytes`: unlimited, `segments`: auto,
/// `auto_plans`: on).
/// A plain aggregate: `cache_options{.segments = segment_policy::off}` works.
///
/// Text form: "key:value" entries separated by commas, the keys and spellings of REFPOOL_CONF
/// ("rounding:pow2:4,max_idle_bytes:512M,segments:off").
struct cache_options {
  /// `max_idle_bytes` for no limit (spelled `unlimited`).
  static constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();

#define REFPOOL_OPTION_FIELD(kind, name, default_text, description) \
  detail::option_kind::kind::type name = detail::parse_option(detail::option_kind::kind{}, #name, default_text);
  REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_FIELD)
#undef REFPOOL_OPTION_FIELD

  /// The defaults with REFPOOL_CONF's cache options applied. Throws `config_error` on a bad
  /// REFPOOL_CONF.
  [[nodiscard]] REFPOOL_API static cache_options from_environment();
  /// The defaults with `conf` applied (see `apply`).
  [[nodiscard]] REFPOOL_API static cache_options from_string(std::string_view conf);

  /// Sets the options `conf` names ("rounding:pow2:4,segments:off"); the others keep their
  /// values. Throws `config_error` naming the key and its allowed values for an unknown key, a bad
  /// value, or a process-wide REFPOOL_CONF key (log, stats_at_exit); nothing changes then.
  REFPOOL_API void apply(std::string_view conf);
  /// Sets option `key` from its text `value` ("pow2:4"). Throws `config_error` as `apply`.
  REFPOOL_API void set(std::string_view key, std::string_view value);
  /// Every option, in the text form: from_string(to_string()) gives these options back.
  [[nodiscard]] REFPOOL_API std::string to_string() const;

  friend bool operator==(const cache_options&, const cache_options&) = default;
};

}  // namespace refpool
