// Small value types shared by every part of the API: devices, streams, memory kinds.
#pragma once

#include <cstdint>
#include <string_view>

namespace refpool {

/// Device ordinal within a backend; -1 for host memory.
using device_id = int;

/// What kind of memory a backend hands out. Part of every cache key: blocks of different
/// kinds are never exchanged.
enum class memory_kind : std::uint8_t {
  host,          ///< pageable host memory
  device,        ///< device memory (cuMemAlloc / hipMalloc)
  device_async,  ///< stream-ordered device memory (cuMemAllocAsync / hipMallocAsync)
  pinned_host,   ///< page-locked host memory (cuMemHostAlloc / hipHostMalloc)
};

/// Name of a memory kind, for messages.
constexpr std::string_view to_string(memory_kind kind) noexcept {
  switch (kind) {
    case memory_kind::host: return "host";
    case memory_kind::device: return "device";
    case memory_kind::device_async: return "device_async";
    case memory_kind::pinned_host: return "pinned_host";
  }
  return "unknown";
}

/// A non-owning reference to a backend stream (CUstream, hipStream_t); the null handle is the
/// backend's default stream. Host backends ignore it.
struct stream_ref {
  void* handle = nullptr;
  friend constexpr bool operator==(stream_ref, stream_ref) = default;
};

}  // namespace refpool
