// refpool_cache_options <-> refpool::cache_options, field by field from REFPOOL_CACHE_OPTIONS.
#pragma once

#include <refpool/cache_options.hpp>
#include <refpool/refpool.h>

namespace refpool::c_api {

refpool_cache_options to_c(const refpool::cache_options& options);
/// Throws `config_error` naming the first field whose value its kind does not allow, and the C
/// values it does.
refpool::cache_options from_c(const refpool_cache_options& options);

}  // namespace refpool::c_api
