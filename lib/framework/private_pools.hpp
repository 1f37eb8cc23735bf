// The framework allocator's private pools (CUDA graph capture; refpool.h, "private pools"): which
// pools exist, how many uses each has, and which routes send requests to them. One mutex guards
// all of it; `routing()` lets the allocation path skip it while no route is in force.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <refpool/alloc_cache.hpp>

namespace refpool::detail {

class private_pools {
 public:
  using id = std::pair<std::uint64_t, std::uint64_t>;
  /// Whether a request on `stream` goes to the pool (nonzero): refpool_stream_filter.
  using stream_filter = int (*)(void* context, void* stream);
  /// Makes a device's pool resource: its cache's backend (see pool_resource).
  using backend_maker = std::function<backend(int device, id pool)>;

  private_pools() = default;
  private_pools(const private_pools&) = delete;
  private_pools& operator=(const private_pools&) = delete;
  ~private_pools();

  /// refpool_allocator_begin_pool. `options` and `make_backend` make the pool if it is new.
  /// Takes `context` in every case (dropped when the route ends, or at once on failure). Throws
  /// invalid_argument for a null filter, pool {0, 0}, or a route to the pool already on `device`.
  void begin(int device, id pool, stream_filter filter, void* context, void (*drop)(void*),
             const cache_options& options, const backend_maker& make_backend);
  /// refpool_allocator_end_pool; invalid_argument if no such route is in force.
  void end(int device, id pool);
  /// refpool_allocator_release_pool: one use fewer; at none the pool is freeable, its memory kept
  /// (a graph captured later may still use a buffer it freed, as with PyTorch's allocator) until
  /// drop_freeable. invalid_argument while a route to the pool remains.
  void release(int device, id pool);
  /// Frees the freeable pools (no use): their idle memory goes back, and those whose buffers are
  /// all freed are dropped; the others stay listed until a later call finds them empty (reclaimed
  /// under the pools' lock: a begin meanwhile would use them again). None while any route is in
  /// force (a capture may use their freed memory).
  void drop_freeable();

  /// True while a route is in force (relaxed: a request racing a begin may miss the new route,
  /// as a request made just before it would).
  [[nodiscard]] bool routing() const noexcept { return routes_.load(std::memory_order_acquire) != 0; }

  /// The pool a request of `device` on `stream` goes to, with its backend; empty if none.
  struct target {
    std::shared_ptr<alloc_cache> cache;
    backend be;
  };
  [[nodiscard]] target route(int device, void* stream);

  /// Calls `use(target)` with pool `pool`'s cache and its backend of `device` (null when the pool
  /// never served the device; both empty if no such pool) under the pools' lock, and returns what
  /// it returns. For a take into a pool (refpool_allocator_pool_take): drop_freeable must not come
  /// between its look and its take, or it drops the pool (no buffer held yet) while the taken
  /// buffer is held. Lock order: the pools' lock, then a cache's (as drop_freeable's).
  template <class Use>
  auto with_pool(id pool, int device, Use&& use) {
    std::lock_guard guard(mutex_);
    return use(find_locked(pool, device));
  }

  [[nodiscard]] std::vector<id> ids();
  /// The pool's cache, or null.
  [[nodiscard]] std::shared_ptr<alloc_cache> cache_of(id pool);

 private:
  struct pool {
    std::shared_ptr<alloc_cache> cache;
    std::map<int, backend> backends;  // one per device the pool served
    long uses = 0;
  };
  struct active_route {
    int device;
    id pool;
    stream_filter filter;
    void* context;
    void (*drop)(void*);
  };

  target find_locked(id pool, int device) const;

  std::mutex mutex_;
  std::map<id, pool> pools_;
  std::vector<active_route> active_;
  std::atomic<std::size_t> routes_{0};
};

}  // namespace refpool::detail
