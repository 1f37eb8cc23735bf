// The front end's copies and fills (refpool/gpu.hpp), ordered on a stream.
#include <fmt/format.h>

#include "runtime_api.hpp"

namespace refpool::gpu::detail {

namespace internal = refpool::detail::gpu;

void copy(runtime r, void* dst, const void* src, std::size_t bytes, stream_ref s, int ordinal) {
  const internal::runtime_api& api = internal::usable(r);
  internal::device_guard guard(api, ordinal);
  internal::check(api, api.copy(dst, src, bytes, s.handle), api.copy.name,
                  fmt::format("{} B from {} to {}", bytes, src, dst));
}

void fill(runtime r, void* dst, unsigned char value, std::size_t bytes, stream_ref s, int ordinal) {
  const internal::runtime_api& api = internal::usable(r);
  internal::device_guard guard(api, ordinal);
  internal::check(api, api.fill(dst, value, bytes, s.handle), api.fill.name, fmt::format("{} B at {}", bytes, dst));
}

void copy_peer(runtime r, void* dst, int dst_device, const void* src, int src_device, std::size_t bytes, stream_ref s) {
  const internal::runtime_api& api = internal::usable(r);
  internal::check_device(api, src_device);
  internal::device_guard guard(api, dst_device);
  internal::check(api, api.copy_peer(dst, dst_device, src, src_device, bytes, s.handle), api.copy_peer.name,
                  fmt::format("{} B from device {} to device {}", bytes, src_device, dst_device));
}

}  // namespace refpool::gpu::detail
