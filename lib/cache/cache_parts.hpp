// Parts of cache_state (cache_state.hpp) that are plain data: what its options fixed, its slots,
// and its step's epoch and router. Guarded as cache_state.hpp's top says.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include <refpool/cache_options.hpp>

#include "cache/extension_points.hpp"
#include "cache/slot.hpp"
#include "cache/spinlock.hpp"

namespace refpool::detail {

/// What the options fixed when the cache was made.
struct cache_settings {
  rounding_policy rounding;
  segment_policy segments;
  bool auto_plans;
  bool bypass;  // REFPOOL_NO_CACHING=1
};

/// Every slot of the cache, and those free to lease (under the cache's mutex).
struct cache_slot_lists {
  std::vector<std::unique_ptr<slot>> all;
  std::vector<slot*> free_scope;    // scope slots not leased now
  std::vector<slot*> free_ambient;  // cache-level slots whose thread ended
};

/// Steps: the epoch of cache-level allocations is odd inside a step (unique in the process:
/// begin_step), even outside; the router of the open step, if any.
struct cache_step_state {
  std::atomic<std::uint64_t> epoch{0};
  std::atomic<request_router*> router{nullptr};  // a counted reference; changes under router_lock
  mutable spinlock router_lock;                  // taken only while a step has a router
};

}  // namespace refpool::detail
