// refpool_cache_options <-> refpool::cache_options, field by field from REFPOOL_CACHE_OPTIONS.
#pragma once

#include <cstddef>

#include <refpool/cache_options.hpp>
#include <refpool/refpool.h>

namespace refpool::c_api {

refpool_cache_options to_c(const refpool::cache_options& options);
/// Throws `config_error` naming the first field whose value its kind does not allow, and the C
/// values it does.
refpool::cache_options from_c(const refpool_cache_options& options);
/// The caller's struct of `size` bytes (refpool.h, "Structs that grow"), whole: options a smaller
/// struct lacks take REFPOOL_CONF's values. Throws api_error for a bad size, config_error for a bad
/// REFPOOL_CONF.
refpool_cache_options read_options(const refpool_cache_options* options, std::size_t size, const char* function);

}  // namespace refpool::c_api
