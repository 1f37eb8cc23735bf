// The C API of cache options (include/refpool/refpool.h, "caches"): defaults, REFPOOL_CONF, conf
// strings, one option by name, and the table bindings build their struct from. Every function
// is expanded from REFPOOL_CACHE_OPTIONS through the kinds of lib/config/option_kinds.hpp.
#include "c_api/cache_options_c.hpp"

#include <array>
#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

#include "c_api/sized_struct.hpp"
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

// An older caller's struct would read the padding of its own as a newer option (sized_struct.hpp).
#define REFPOOL_OPTION_END(kind, name, default_text, description) \
  end = offsetof(refpool_cache_options, name) + sizeof(refpool_cache_options::name);
constexpr std::size_t last_option_end() {
  std::size_t end = 0;
  REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_END)
  return end;
}
#undef REFPOOL_OPTION_END
static_assert(ends_without_padding<refpool_cache_options, last_option_end()>,
              "refpool_cache_options ends in padding: append an explicit padding field with the new option");

constexpr const char* options_type = "refpool_cache_options";

/// Writes `options` into the caller's struct of `size` bytes. A caller struct too small for an
/// option that differs from `base` (what the caller's struct would be read back as) cannot hold it:
/// CONFIG naming the option, and nothing is written.
void write_options(const refpool::cache_options& options, const refpool::cache_options& base,
                   refpool_cache_options* out, std::size_t size, const char* function) {
  check_struct_size<refpool_cache_options>(size, function, options_type);
#define REFPOOL_OPTION_FITS(kind, name, default_text, description)                                                   \
  if (size < offsetof(refpool_cache_options, name) + sizeof(refpool_cache_options::name) &&                          \
      detail::option_traits<detail::option_kind::kind>::format(options.name) !=                                      \
          detail::option_traits<detail::option_kind::kind>::format(base.name))                                       \
    throw refpool::config_error(fmt::format(                                                                          \
        "refpool: {}: option " #name " is {}, but the caller's refpool_cache_options ({} bytes) has no field for it: " \
        "it was built against an older refpool.h; set the option in REFPOOL_CONF instead",                            \
        function, detail::option_traits<detail::option_kind::kind>::format(options.name), size));
  REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_FITS)
#undef REFPOOL_OPTION_FITS
  write_sized(to_c(options), out, size, function, options_type);
}

/// The options in `function`'s argument, read as they are written back: fields the caller's
/// struct lacks from REFPOOL_CONF.
refpool::cache_options options_argument(refpool_cache_options* options, std::size_t size, const char* function) {
  return from_c(read_options(&required(options, function, "options"), size, function));
}

}  // namespace

refpool_cache_options read_options(const refpool_cache_options* options, std::size_t size, const char* function) {
  check_struct_size<refpool_cache_options>(size, function, options_type);
  const refpool_cache_options base =
      size < sizeof(refpool_cache_options) ? to_c(refpool::cache_options::from_environment()) : refpool_cache_options{};
  return read_sized(options, size, base, function, options_type);
}

refpool_cache_options to_c(const refpool::cache_options& options) {
  refpool_cache_options out;
  std::memset(&out, 0, sizeof out);  // its padding too: the struct is copied out whole
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

// init writes the defaults whatever the caller's size: an option it lacks reads back as
// REFPOOL_CONF's value, which is that option's setting for the process.
refpool_status refpool_cache_options_init(refpool_cache_options* options, size_t options_size) {
  return guarded([&] {
    write_sized(to_c(refpool::cache_options{}), &required(options, "refpool_cache_options_init", "options"),
                options_size, "refpool_cache_options_init", options_type);
  });
}

refpool_status refpool_cache_options_from_environment(refpool_cache_options* options, size_t options_size) {
  return guarded([&] {
    write_sized(to_c(refpool::cache_options::from_environment()),
                &required(options, "refpool_cache_options_from_environment", "options"), options_size,
                "refpool_cache_options_from_environment", options_type);
  });
}

// Both go through refpool::cache_options, so a C struct with a bad field is refused here too.
refpool_status refpool_cache_options_parse(refpool_cache_options* options, size_t options_size, const char* conf) {
  return guarded([&] {
    const refpool::cache_options given = options_argument(options, options_size, "refpool_cache_options_parse");
    refpool::cache_options changed = given;
    changed.apply(text_argument(conf, "refpool_cache_options_parse", "conf"));
    write_options(changed, given, options, options_size, "refpool_cache_options_parse");
  });
}

refpool_status refpool_cache_options_set(refpool_cache_options* options, size_t options_size, const char* name,
                                         const char* value) {
  return guarded([&] {
    const refpool::cache_options given = options_argument(options, options_size, "refpool_cache_options_set");
    refpool::cache_options changed = given;
    changed.set(text_argument(name, "refpool_cache_options_set", "name"),
                text_argument(value, "refpool_cache_options_set", "value"));
    write_options(changed, given, options, options_size, "refpool_cache_options_set");
  });
}

size_t refpool_cache_option_count(void) { return option_infos.size(); }

refpool_status refpool_cache_option_info(size_t index, refpool_option_info* out, size_t out_size) {
  return guarded([&] {
    if (index >= option_infos.size())
      fail(REFPOOL_ERROR_INVALID_ARGUMENT,
           fmt::format("refpool: refpool_cache_option_info: index {} is past the last option ({} options)", index,
                       option_infos.size()));
    write_sized(option_infos[index], out, out_size, "refpool_cache_option_info", "refpool_option_info");
  });
}

}  // extern "C"
