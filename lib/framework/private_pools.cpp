#include "framework/private_pools.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "gpu/captures.hpp"

namespace refpool::detail {

namespace {
std::string name_of(private_pools::id pool) { return fmt::format("private pool ({}, {})", pool.first, pool.second); }

// Drops a route's context outside the lock: the framework's destructor may do anything.
void drop_context(void (*drop)(void*), void* context) noexcept {
  if (drop != nullptr) drop(context);
}
}  // namespace

private_pools::~private_pools() {
  for (const active_route& r : active_) drop_context(r.drop, r.context);
}

void private_pools::begin(int device, id pool_id, stream_filter filter, void* context, void (*drop)(void*),
                          const cache_options& options, const backend_maker& make_backend) {
  try {
    if (filter == nullptr) throw invalid_argument("refpool: refpool_allocator_begin_pool: filter is NULL");
    if (pool_id == id{0, 0}) throw invalid_argument("refpool: refpool_allocator_begin_pool: pool {0, 0} names no pool");
    backend be = make_backend(device, pool_id);  // before the lock: it may load a driver
    std::lock_guard guard(mutex_);
    for (const active_route& r : active_)
      if (r.device == device && r.pool == pool_id)
        throw invalid_argument(
            fmt::format("refpool: refpool_allocator_begin_pool: requests of device {} are already routed to {}", device,
                        name_of(pool_id)));
    active_.reserve(active_.size() + 1);  // nothing below throws once the pool exists
    auto found = pools_.find(pool_id);
    if (found == pools_.end()) {
      // Never idle-limited: a pool's idle bytes are what its graphs replay into.
      cache_options pool_options = options;
      pool_options.max_idle_bytes = cache_options::unlimited;
      pool made;
      made.cache = std::make_shared<alloc_cache>(pool_options);
      found = pools_.emplace(pool_id, std::move(made)).first;
    }
    found->second.backends.try_emplace(device, std::move(be));
    found->second.uses += 1;
    active_.push_back({device, pool_id, filter, context, drop});
    routes_.fetch_add(1, std::memory_order_release);
    gpu::capture_announced(device);  // a route brackets a capture: no device-wide waits until its end
  } catch (...) {
    drop_context(drop, context);
    throw;
  }
}

void private_pools::end(int device, id pool_id) {
  active_route ended{};
  {
    std::lock_guard guard(mutex_);
    auto it = std::find_if(active_.begin(), active_.end(),
                           [&](const active_route& r) { return r.device == device && r.pool == pool_id; });
    if (it == active_.end())
      throw invalid_argument(fmt::format(
          "refpool: refpool_allocator_end_pool: no requests of device {} are routed to {}", device, name_of(pool_id)));
    ended = *it;
    active_.erase(it);
    routes_.fetch_sub(1, std::memory_order_release);
  }
  gpu::capture_over(device);  // outside the lock: the last one gives back what the captures kept
  drop_context(ended.drop, ended.context);
}

void private_pools::release(int device, id pool_id) {
  std::lock_guard guard(mutex_);
  auto found = pools_.find(pool_id);
  if (found == pools_.end()) return;
  for (const active_route& r : active_)
    if (r.pool == pool_id)
      throw invalid_argument(
          fmt::format("refpool: refpool_allocator_release_pool: requests of device {} are still routed to {}",
                      r.device, name_of(pool_id)));
  (void)device;  // PyTorch names the capture's device; the pool's uses span every device
  if (found->second.uses > 0) found->second.uses -= 1;  // at 0 freeable: drop_freeable frees it
}

void private_pools::drop_freeable() {
  std::vector<std::shared_ptr<alloc_cache>> freed;  // destroyed outside the lock: they free idle memory
  {
    std::lock_guard guard(mutex_);
    // While a route is in force a graph may be captured, and it may use memory a released pool
    // got back during the capture (a freed graph output): PyTorch's allocator frees released
    // pools only while no capture is underway.
    if (!active_.empty()) return;
    for (auto it = pools_.begin(); it != pools_.end();) {
      if (it->second.uses > 0) {
        ++it;
        continue;
      }
      // No route and no use: no request reaches it now, and a take into it waits for this lock.
      // Every buffer held counts: its blocks, and what a step opened on its cache served from the
      // backend (warm-up) or from a plan's arena.
      if (it->second.cache->stats().allocated_bytes > 0) {
        // As PyTorch's allocator keeps a released graph pool until its last block is freed: the
        // bytes its buffers hold stay in its stats, memory_reserved() and snapshots. Reclaimed under
        // the lock: the pool stays listed, and a begin made meanwhile would route requests to it,
        // whose freed buffers its graphs replay into (as PyTorch holds its lock over this too).
        try {
          (void)it->second.cache->reclaim(0);
        } catch (const std::exception& e) {
          // Less memory back (a driver error ordering a segment's streams), as on a cache's own
          // out-of-memory path: the other pools still go, and a request out of memory still retries.
          fmt::print(stderr, "refpool: giving back the idle memory of released {} failed: {}\n", name_of(it->first),
                     e.what());
        }
        ++it;
        continue;
      }
      freed.push_back(std::move(it->second.cache));
      it = pools_.erase(it);
    }
  }
}

private_pools::target private_pools::route(int device, void* stream) {
  std::lock_guard guard(mutex_);
  // The latest route first (LIFO, as PyTorch's allocator): nested use_mem_pool blocks on one thread
  // accept the same requests, and the innermost takes them.
  for (auto it = active_.rbegin(); it != active_.rend(); ++it) {
    const active_route& r = *it;
    if (r.device != device || r.filter(r.context, stream) == 0) continue;
    pool& p = pools_.at(r.pool);
    return {p.cache, p.backends.at(device)};
  }
  return {};
}

private_pools::target private_pools::find_locked(id pool_id, int device) const {
  auto found = pools_.find(pool_id);
  if (found == pools_.end()) return {};
  auto be = found->second.backends.find(device);
  return {found->second.cache, be == found->second.backends.end() ? backend{} : be->second};
}

std::vector<private_pools::id> private_pools::ids() {
  std::lock_guard guard(mutex_);
  std::vector<id> out;
  out.reserve(pools_.size());
  for (const auto& [pool_id, p] : pools_) out.push_back(pool_id);
  return out;
}

std::shared_ptr<alloc_cache> private_pools::cache_of(id pool_id) {
  std::lock_guard guard(mutex_);
  auto found = pools_.find(pool_id);
  return found == pools_.end() ? nullptr : found->second.cache;
}

}  // namespace refpool::detail
