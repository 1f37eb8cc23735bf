// The cache options by name (REFPOOL_CACHE_OPTIONS): which keys are options, and setting one
// from its text. REFPOOL_CONF, conf strings and the C API all set options through here.
#pragma once

#include <string_view>

#include <refpool/cache_options.hpp>

namespace refpool::detail {

/// "rounding, max_idle_bytes, segments": every option, in order, for error messages.
[[nodiscard]] std::string_view cache_option_names();
[[nodiscard]] bool is_cache_option(std::string_view key) noexcept;

/// Sets option `key` of `options` from `value`. `what` says in errors where the key came from
/// ("REFPOOL_CONF key", "cache option"). Throws `config_error` naming the key and the allowed
/// values (for an unknown key: the option names); `options` is unchanged then.
void set_cache_option(cache_options& options, std::string_view key, std::string_view value, std::string_view what);

}  // namespace refpool::detail
