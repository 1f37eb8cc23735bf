// The CUDA backend: device, stream-ordered and pinned memory through the CUDA driver API, which
// refpool loads at run time (libcuda.so.1, CUDA 12.0 or newer), so one binary runs with or without
// a GPU. Also the few driver services numerical code needs around the pool: streams and copies
// (the GPU front end of refpool/gpu.hpp, shared with HIP).
// Without a usable driver every function here throws `backend_unavailable` saying why;
// `available()` asks without throwing. A build without CUDA support links and throws the same way.
#pragma once

#include <refpool/gpu.hpp>

namespace refpool::cuda {

/// The runtime this namespace drives.
inline constexpr gpu::runtime this_runtime = gpu::runtime::cuda;

#include <refpool/detail/gpu_runtime_namespace.inc>

/// Driver version as CUDA encodes it (13000 = 13.0): cuDriverGetVersion. Throws
/// `backend_unavailable`.
[[nodiscard]] inline int driver_version() { return gpu::detail::driver_version(this_runtime); }

}  // namespace refpool::cuda
