// The HIP backend: device, stream-ordered and pinned memory through the HIP runtime (AMD GPUs),
// which refpool loads at run time (the one the process already has, else libamdhip64.so.7, .so.6,
// .so.5, then .so; HIP 5.2 or newer of majors 5 to 7: docs/hip.md), so one binary runs with or
// without it. Also the few runtime services numerical code needs around the pool: streams and
// copies (the GPU front end of refpool/gpu.hpp, shared with CUDA).
// Without a usable runtime every function here throws `backend_unavailable` saying why;
// `available()` asks without throwing. A build without HIP support links and throws the same way.
#pragma once

#include <refpool/gpu.hpp>

namespace refpool::hip {

/// The runtime this namespace drives.
inline constexpr gpu::runtime this_runtime = gpu::runtime::hip;

#include <refpool/detail/gpu_runtime_namespace.inc>

/// Runtime version as HIP encodes it (major * 10'000'000 + minor * 100'000 + patch; 50221153 is
/// 5.2.21153): hipRuntimeGetVersion. Throws `backend_unavailable`.
[[nodiscard]] inline int runtime_version() { return gpu::detail::runtime_version(this_runtime); }

/// Driver version as hipDriverGetVersion reports it (on AMD, encoded as runtime_version()).
/// Throws `backend_unavailable`, `backend_error`.
[[nodiscard]] inline int driver_version() { return gpu::detail::driver_version(this_runtime); }

}  // namespace refpool::hip
