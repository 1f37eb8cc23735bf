// The C API of cache options (include/refpool/refpool.h, "caches"): defaults, REFPOOL_CONF, conf
// strings, one option by name, and the table bindings build their struct from. Every function
// is expanded from REFPOOL_CACHE_OPTIONS through the kinds of lib/config/option_kinds.hpp.
#include "c_api/cache_options_c.hpp"

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "c_api/support.hpp"
#include "config/option_kinds.hpp"

namespace refpool::c_api {

namespace {

template <class Kind>
typename Kind::type field_from_c(const char* name, const typename detail::option_traits<Kind>::c_type& value) {
  using traits = detail::option_traits<Kind>;
  const std::string text = traits::c_text(value);  // a bad C value gives a text parse rejects
  if (auto parsed = traits::parse(text)) return *parsed;
  throw refpool::config_error(
      fmt::format("refpool: refpool_cache_options.{} is {}; allowed: {}", name, text, traits::allowed_c));
}

constexpr std::array option_infos{
#define REFPOOL_OPTION_INFO(kind, name, default_text, description)                      \
  refpool_option_info{#name,                                                            \
                      #kind,                                                            \
                      offsetof(refpool_cache_options, name),                            \
                      sizeof(refpool_cache_options::name),                              \
                      default_text,                                                     \
                      detail::option_traits<detail::option_kind::kind>::allowed.data(), \
                      description},
    REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_INFO)
#undef REFPOOL_OPTION_INFO
};

std::string_view text_argument(const char* text, const char* function, const char* what) {
  if (text == nullptr) fail(REFPOOL_ERROR_INVALID_ARGUMENT, fmt::format("refpool: {}: {} is NULL", function, what));
  return text;
}

}  // namespace

refpool_cache_options to_c(const refpool::cache_options& options) {
  refpool_cache_options out{};
#define REFPOOL_OPTION_TO_C(kind, name, default_text, description) \
  out.name = detail::option_traits<detail::option_kind::kind>::to_c(options.name);
  REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_TO_C)
#undef REFPOOL_OPTION_TO_C
  return out;
}

refpool::cache_options from_c(const refpool_cache_options& options) {
  refpool::cache_options out;
#define REFPOOL_OPTION_FROM_C(kind, name, default_text, description) \
  out.name = field_from_c<detail::option_kind::kind>(#name, options.name);
  REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_FROM_C)
#undef REFPOOL_OPTION_FROM_C
  return out;
}

}  // namespace refpool::c_api

using namespace refpool::c_api;

extern "C" {

refpool_status refpool_cache_options_init(refpool_cache_options* options) {
  return guarded([&] { required(options, "refpool_cache_options_init", "options") = to_c(refpool::cache_options{}); });
}

refpool_status refpool_cache_options_from_environment(refpool_cache_options* options) {
  return guarded([&] {
    refpool_cache_options& result = required(options, "refpool_cache_options_from_environment", "options");
    result = to_c(refpool::cache_options::from_environment());
  });
}

// Both go through refpool::cache_options, so a C struct with a bad field is refused here too.
refpool_status refpool_cache_options_parse(refpool_cache_options* options, const char* conf) {
  return guarded([&] {
    refpool_cache_options& result = required(options, "refpool_cache_options_parse", "options");
    refpool::cache_options changed = from_c(result);
    changed.apply(text_argument(conf, "refpool_cache_options_parse", "conf"));
    result = to_c(changed);
  });
}

refpool_status refpool_cache_options_set(refpool_cache_options* options, const char* name, const char* value) {
  return guarded([&] {
    refpool_cache_options& result = required(options, "refpool_cache_options_set", "options");
    refpool::cache_options changed = from_c(result);
    changed.set(text_argument(name, "refpool_cache_options_set", "name"),
                text_argument(value, "refpool_cache_options_set", "value"));
    result = to_c(changed);
  });
}

size_t refpool_cache_option_count(void) { return option_infos.size(); }

const refpool_option_info* refpool_cache_option_info(size_t index) {
  return index < option_infos.size() ? &option_infos[index] : nullptr;
}

}  // extern "C"
