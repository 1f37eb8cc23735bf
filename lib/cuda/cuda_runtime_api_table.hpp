// The CUDA driver's entries in the shared GPU runtime table.
#pragma once

#include "../gpu/runtime_api.hpp"

namespace refpool::detail::cuda {

/// The table the shared GPU resource uses for CUDA. Valid only once driver() succeeded.
const gpu::runtime_api& runtime_table();

}  // namespace refpool::detail::cuda
