// refpool: a scoped allocation cache whose cache holds refcounted buffers, not arrays.
// Include this one header for the whole C++ API.
#pragma once

#include <refpool/adaptors.hpp>
#include <refpool/alloc_cache.hpp>
#include <refpool/array.hpp>
#include <refpool/backend.hpp>
#include <refpool/cache_options.hpp>
#include <refpool/config.hpp>
#include <refpool/cuda.hpp>
#include <refpool/data_ref.hpp>
#include <refpool/error.hpp>
#include <refpool/hip.hpp>
#include <refpool/pointer.hpp>
#include <refpool/resource.hpp>
#include <refpool/rounding.hpp>
#include <refpool/scope.hpp>
#include <refpool/shape.hpp>
#include <refpool/stats.hpp>
#include <refpool/types.hpp>
#include <refpool/virtual_memory.hpp>
