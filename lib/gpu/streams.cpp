// The front end's streams (refpool/gpu.hpp), and the streams refpool must never use again.
#include <mutex>
#include <shared_mutex>
#include <unordered_set>

#include <fmt/format.h>

#include "runtime_api.hpp"

namespace refpool::detail::gpu {

namespace {
struct retired_streams {
  std::shared_mutex mutex;  // shared: users of streams; exclusive: retire and revive
  std::unordered_set<handle> handles;
};
retired_streams& retired_set() {
  static auto* instance = new retired_streams;  // leaked: blocks may be freed by static destructors
  return *instance;
}
}  // namespace

void retire_stream(handle stream) {
  std::unique_lock guard(retired_set().mutex);
  retired_set().handles.insert(stream);
}

void revive_stream(handle stream) {
  std::unique_lock guard(retired_set().mutex);
  retired_set().handles.erase(stream);
}

retirement_lock::retirement_lock() { retired_set().mutex.lock_shared(); }

retirement_lock::~retirement_lock() { retired_set().mutex.unlock_shared(); }

bool retirement_lock::retired(handle stream) const {
  return stream != nullptr && retired_set().handles.count(stream) != 0;
}

}  // namespace refpool::detail::gpu

namespace refpool::gpu::detail {

namespace internal = refpool::detail::gpu;

void* create_stream(runtime r, int ordinal) {
  const internal::runtime_api& api = internal::usable(r);
  internal::device_guard guard(api, ordinal);
  internal::handle stream = nullptr;
  internal::check(api, api.stream_create(&stream), api.stream_create.name, fmt::format("device {}", ordinal));
  internal::revive_stream(stream);
  return stream;
}

// Synchronises and destroys a stream refpool made, retiring its handle first (see retire_stream).
void destroy_stream(runtime r, void* stream) noexcept {
  if (stream == nullptr) return;
  const internal::runtime_api& api = internal::table(r);  // usable: the stream was made
  (void)api.stream_synchronize(stream);
  internal::retire_stream(stream);
  (void)api.stream_destroy(stream);
}

void synchronize(runtime r, stream_ref s, int ordinal) {
  const internal::runtime_api& api = internal::usable(r);
  internal::device_guard guard(api, ordinal);
  internal::check(api, api.stream_synchronize(s.handle), api.stream_synchronize.name);
}

void retire_stream(runtime r, stream_ref s, int ordinal) {
  synchronize(r, s, ordinal);
  internal::retire_stream(s.handle);
}

}  // namespace refpool::gpu::detail
