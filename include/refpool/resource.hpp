// The interface every backend implements: a few primitives with one error convention.
// refpool ships host, CUDA and HIP resources; users may implement their own.
#pragma once

#include <cstddef>
#include <string_view>

#include <refpool/detail/export.hpp>
#include <refpool/types.hpp>
#include <refpool/virtual_memory.hpp>

namespace refpool {

/// Raw memory source behind a `backend`.
///
/// Thread safety: implementations must be thread-safe; refpool calls them from any thread. It
/// never calls them while holding a cache's mutex or the lock of a cache's slot (so the hit
/// path never waits for a driver call). Some calls do run under a lock of the one structure
/// they grow or shrink, held only by threads that need that structure: a cache's segment heap
/// for a backend (its growth, trim and device-wide waits: allocate, deallocate, order_streams,
/// synchronize and the address space's calls) and a plan's arena. An implementation must
/// therefore not call back into refpool (allocate through a cache, free a data_ref) from these
/// calls.
class REFPOOL_API resource {
 public:
  virtual ~resource() = default;

  /// Short name for messages and stats ("host", "cuda:0 device").
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// Device ordinal, -1 for host memory.
  [[nodiscard]] virtual device_id device() const noexcept = 0;
  [[nodiscard]] virtual memory_kind kind() const noexcept = 0;
  /// Alignment every returned pointer has.
  [[nodiscard]] virtual std::size_t alignment() const noexcept = 0;

  /// Returns `bytes` (> 0) of memory usable on `stream`. Returns nullptr if and only if the
  /// device is out of memory (the cache then reclaims and retries); any other failure throws
  /// `backend_error`.
  [[nodiscard]] virtual void* allocate(std::size_t bytes, stream_ref stream) = 0;

  /// Gives memory from `allocate` back. `stream` is the stream it was last used on.
  virtual void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept = 0;

  /// Makes work submitted to `consumer` from now on wait for all work already submitted to
  /// `producer`. The cache calls it when a block last used on `producer` is handed out for
  /// `consumer`. Host memory needs nothing, hence the default. Throws `stream_order_unavailable`,
  /// having enqueued nothing, when the two cannot be ordered now (one captures a graph and the
  /// other is not in that capture): the cache then leaves that memory to a later request or
  /// reclaim (docs/design.md, "Stream safety"). `synchronize` throws it too where a device-wide
  /// wait is refused because a stream captures.
  virtual void order_streams(stream_ref producer, stream_ref consumer) {
    (void)producer;
    (void)consumer;
  }

  /// Waits until all work submitted so far on every stream of the device has finished. The
  /// cache calls it, rarely, before handing out or freeing memory whose last users it can no
  /// longer name (bytes of a segment that more than eight streams used between two such waits:
  /// docs/design.md, "Segments"). Host memory needs nothing, hence the default; a resource
  /// whose memory is used on streams must override it (cuCtxSynchronize, hipDeviceSynchronize).
  virtual void synchronize() {}

  /// The backend's reserve/commit interface, or nullptr when it has none (the default). Owned by
  /// the resource; lives as long as it. The segment allocator grows segments through it.
  [[nodiscard]] virtual virtual_memory* address_space() noexcept { return nullptr; }
};

}  // namespace refpool
