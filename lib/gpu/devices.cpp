// The front end's devices (refpool/gpu.hpp): availability, versions, names, memory, backends.
#include <fmt/format.h>

#include <refpool/error.hpp>

#include "runtime_api.hpp"

namespace refpool::gpu::detail {

namespace internal = refpool::detail::gpu;

bool available(runtime r) noexcept { return internal::table(r).failure().empty(); }

std::string unavailable_reason(runtime r) { return internal::table(r).failure(); }

int device_count(runtime r) { return internal::usable(r).device_count(); }

int runtime_version(runtime r) { return internal::usable(r).version(); }

int driver_version(runtime r) {
  const internal::runtime_api& api = internal::usable(r);
  int version = 0;
  internal::check(api, api.driver_version(&version), api.driver_version.name);
  return version;
}

std::string device_name(runtime r, int ordinal) {
  const internal::runtime_api& api = internal::usable(r);
  internal::check_device(api, ordinal);
  char name[256] = {};
  internal::check(api, api.device_name(ordinal, name, sizeof name), api.device_name.name,
                  fmt::format("device {}", ordinal));
  return name;
}

std::pair<std::size_t, std::size_t> memory_info(runtime r, int ordinal) {
  const internal::runtime_api& api = internal::usable(r);
  internal::device_guard guard(api, ordinal);
  std::size_t free = 0;
  std::size_t total = 0;
  internal::check(api, api.memory_info(&free, &total), api.memory_info.name, fmt::format("device {}", ordinal));
  return {free, total};
}

backend device(runtime r, int ordinal, memory_kind kind) {
  const internal::runtime_api& api = internal::usable(r);
  if (kind != memory_kind::host) {
    internal::check_device(api, ordinal);
    if (const std::string why = api.kind_unavailable(kind); !why.empty())
      throw backend_unavailable(fmt::format("refpool: {}", why));
  }
  return internal::shared_backend(api, ordinal, kind);
}

}  // namespace refpool::gpu::detail
