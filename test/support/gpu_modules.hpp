// Kernel modules and launches for the GPU tests: refpool's internal lib/gpu/modules.hpp (exported
// from librefpool, not installed), with the names the tests use per runtime.
#pragma once

#include "../../lib/gpu/modules.hpp"

namespace refpool::test::gpu_modules {

using refpool::gpu::dims3;
using refpool::gpu::launch;
using refpool::gpu::launch_with;
template <refpool::gpu::runtime R>
using module = refpool::gpu::basic_module<R>;
template <refpool::gpu::runtime R>
using kernel = refpool::gpu::basic_kernel<R>;
using cuda_module = module<refpool::gpu::runtime::cuda>;
using cuda_kernel = kernel<refpool::gpu::runtime::cuda>;
using hip_module = module<refpool::gpu::runtime::hip>;
using hip_kernel = kernel<refpool::gpu::runtime::hip>;

}  // namespace refpool::test::gpu_modules
