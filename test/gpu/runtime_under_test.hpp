// The runtime a GPU test program is built for: CUDA, or HIP where REFPOOL_TEST_HIP is defined.
// Meson compiles each GPU test source once per runtime; what differs between them is here, with
// the helpers they share.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <refpool/refpool.hpp>

namespace refpool::test {

#ifdef REFPOOL_TEST_HIP
namespace rt = refpool::hip;
inline constexpr bool compiled_in = REFPOOL_HAS_HIP;
inline constexpr std::string_view runtime_name = "HIP";
inline constexpr std::string_view backend_prefix = "hip";  ///< backend names: "hip:0 device"
inline constexpr std::string_view error_prefix = "HIP error hipError";
inline constexpr std::string_view module_load_call = "hipModuleLoadData";
/// HIP 5.2, the oldest runtime refpool accepts.
inline bool version_supported() { return rt::runtime_version() >= 50'200'000; }
/// Stream-ordered memory (memory_kind::device_async): HIP 5.3 and newer.
inline bool async_supported() { return rt::runtime_version() >= 50'300'000; }
#else
namespace rt = refpool::cuda;
inline constexpr bool compiled_in = REFPOOL_HAS_CUDA;
inline constexpr std::string_view runtime_name = "CUDA";
inline constexpr std::string_view backend_prefix = "cuda";
inline constexpr std::string_view error_prefix = "CUDA error CUDA_ERROR_";
inline constexpr std::string_view module_load_call = "cuModuleLoadDataEx";
/// CUDA 12.0, the oldest driver refpool accepts.
inline bool version_supported() { return rt::driver_version() >= 12000; }
inline bool async_supported() { return true; }
#endif

/// The `bytes` at `src` (device or host memory), copied on `s` and waited for.
inline std::vector<std::uint8_t> download(const void* src, std::size_t bytes, refpool::stream_ref s) {
  std::vector<std::uint8_t> out(bytes);
  rt::copy(out.data(), src, bytes, s);
  rt::synchronize(s);
  return out;
}

}  // namespace refpool::test
