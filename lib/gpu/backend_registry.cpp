// The process-wide backends of every GPU runtime, one per (runtime, device, memory kind), made at
// first use over the shared GPU resource.
#include <map>
#include <mutex>
#include <tuple>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "runtime_api.hpp"

namespace refpool::detail::gpu {

backend shared_backend(const runtime_api& api, int device, memory_kind kind) {
  if (kind == memory_kind::host)
    throw backend_unavailable(
        fmt::format("refpool: the {} backend has device, device_async and pinned_host memory; "
                    "pageable host memory is refpool::host_backend()",
                    api.name));
  // Leaked on purpose: blocks may be freed by static destructors after this map would be gone.
  static auto* backends = new std::map<std::tuple<const runtime_api*, int, memory_kind>, backend>;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  auto [it, inserted] = backends->try_emplace({&api, device, kind});
  if (inserted) {
    try {
      if (kind == memory_kind::device_async)
        check(api, api.keep_pool_memory(device), api.keep_pool_memory.name, fmt::format("device {}", device));
      it->second =
          backend(make_resource(api, device, kind, fmt::format("{}:{} {}", api.prefix, device, to_string(kind))));
    } catch (...) {
      backends->erase(it);
      throw;
    }
  }
  return it->second;
}

}  // namespace refpool::detail::gpu
