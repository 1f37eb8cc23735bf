// "key:value,key:value": the text form shared by REFPOOL_CONF and conf strings. The value is all
// after the first ':' ("rounding:pow2:4" sets rounding to "pow2:4"); empty entries are skipped.
#pragma once

#include <string_view>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

/// Calls `entry(key, value)` for each entry of `conf`, in order. Throws `config_error` for an
/// entry without ':', naming `source` ("REFPOOL_CONF", "conf") and the `keys` it takes.
template <class Entry>
void for_each_conf_entry(std::string_view conf, std::string_view source, std::string_view keys, Entry&& entry) {
  while (!conf.empty()) {
    const auto comma = conf.find(',');
    const auto item = conf.substr(0, comma);
    conf = comma == std::string_view::npos ? std::string_view{} : conf.substr(comma + 1);
    if (item.empty()) continue;
    const auto colon = item.find(':');
    if (colon == std::string_view::npos)
      throw config_error(fmt::format("refpool: {} entry '{}' is not key:value; keys: {}", source, item, keys));
    entry(item.substr(0, colon), item.substr(colon + 1));
  }
}

}  // namespace refpool::detail
