// The framework allocator's slow paths: making its cache and per-device backends, limits, emptying
// the cache, and beginning private pools (framework_allocator.hpp).
#include "framework/framework_allocator.hpp"

#include <refpool/cuda.hpp>
#include <refpool/hip.hpp>
#include <refpool/scope.hpp>

#include <fmt/format.h>

#include "access.hpp"
#include "api/take_at.hpp"
#include "config/env_config.hpp"
#include "byte_text.hpp"
#include "cache/cache_state.hpp"
#include "cache/segment_source.hpp"
#include "cache/oom_text.hpp"
#include "framework/pool_resource.hpp"

namespace refpool::detail {

std::shared_ptr<alloc_cache> framework_allocator::cache() {
  std::lock_guard guard(mutex_);
  if (cache_ == nullptr) {
    in_use_options_ = configured_ ? config_.cache : cache_options::from_environment();
    cache_ = std::make_shared<alloc_cache>(in_use_options_);
    made_.store(cache_.get(), std::memory_order_release);
  }
  return cache_;
}

void framework_allocator::set_device_limit(int device, std::size_t bytes) {
  (void)backend_for(device);  // makes the device's budget
  std::lock_guard guard(mutex_);
  budgets_[static_cast<std::size_t>(device)]->set_capacity(bytes);
}

void framework_allocator::empty_cache() {
  pools_.drop_freeable();
  std::shared_ptr<alloc_cache> made;
  {
    std::lock_guard guard(mutex_);
    made = cache_;
  }
  if (made != nullptr) made->reclaim(0);
}

void framework_allocator::begin_pool(int device, private_pools::id pool, private_pools::stream_filter filter,
                                     void* context, void (*drop)(void*)) {
  cache_options options;
  try {
    (void)cache();  // fixes the configuration: pools take the cache's options
    std::lock_guard guard(mutex_);
    options = in_use_options_;
  } catch (...) {
    if (drop != nullptr) drop(context);  // the context is ours from the call on
    throw;
  }
  pools_.begin(device, pool, filter, context, drop, options, [this](int d, private_pools::id p) {
    return backend(
        std::make_shared<pool_resource>(backend_for(d), fmt::format("private pool ({}, {})", p.first, p.second)));
  });
}

void* framework_allocator::take_in_pool(int device, private_pools::id pool, void* address, std::size_t bytes,
                                        stream_ref stream) {
  const std::string where =
      fmt::format("refpool_allocator_pool_take in private pool ({}, {})", pool.first, pool.second);
  // Under the pools' lock: empty_cache drops a released pool only while none of its buffers is
  // held, so it must not come between the look and the take.
  return pools_.with_pool(pool, device, [&](const private_pools::target& found) {
    if (found.cache == nullptr) throw invalid_argument(fmt::format("refpool: {}: there is no such pool", where));
    if (!found.be) throw invalid_argument(fmt::format("refpool: {}: the pool never served device {}", where, device));
    return to_pointer(take_idle_at(*found.cache, found.be, address, bytes, stream, where));
  });
}

bool framework_allocator::no_caching_in_environment() noexcept {
  static const bool bypassed = [] {
    try {
      return environment().no_caching;
    } catch (...) {  // a bad REFPOOL_CONF: the first request says so; its cache is not made
      return false;
    }
  }();
  return bypassed;
}

void* framework_allocator::allocate_uncached(std::size_t bytes, int device, stream_ref stream) {
  // The first use fixes the configuration, as a cached request's does: a later configure is refused
  // instead of changing the cache's options under a backend already made from the old ones.
  if (made_.load(std::memory_order_acquire) == nullptr) (void)cache();
  const backend& be = backend_for(device);
  // Suspends a scope the calling thread may have open on a cache of its own: the request is the
  // backend's, whatever the thread does around it.
  const auto direct = [&] {
    uncached_guard bypass;
    return refpool::allocate(be, bytes, stream);
  };
  try {
    return to_pointer(direct());
  } catch (const out_of_memory&) {
    // What the cache and the released pools hold idle (from before caching was turned off) goes
    // back first: no request can use it now. That includes the arenas of the cache's plans that no
    // run holds, which empty_cache keeps for the next run (the cache's own out-of-memory path
    // yields them too).
    empty_cache();
    if (alloc_cache* made = made_.load(std::memory_order_acquire)) {
      segment_source& spans = access::state(*made).spans();
      if (const backend_state* state = access::state(be); state != nullptr && spans.yield_idle_spans(*state) > 0)
        (void)spans.trim(0, state, true);
    }
  }
  try {
    return to_pointer(direct());
  } catch (const out_of_memory& e) {
    // The backend's own message says "no cache to reclaim" and points at REFPOOL_NO_CACHING: not
    // so here, where the caller turned caching off and the cache's idle memory went back.
    throw out_of_memory(
        fmt::format("refpool: out of memory: {} could not allocate {} {} with the framework allocator's caching "
                    "off (refpool_allocator_set_caching(0); PyTorch's caching_allocator_enable(False)): the "
                    "request went to the runtime, once more after the cache and the released private pools "
                    "gave their idle memory back; the backend has {} outstanding. What to do: release buffers "
                    "no longer needed, or raise the device limit if one is set (refpool_allocator_set_device_limit)",
                    be.name(), scaled_bytes(bytes), memory_place(be.device()), scaled_bytes(be.outstanding_bytes())),
        e.requested_bytes(), e.device());
  }
}

const backend& framework_allocator::make_backend(int device) {
  if (device < 0 || device >= max_devices)  // a refpool::error: it may reach PyTorch (see refpool_torch_malloc)
    throw invalid_argument(
        fmt::format("refpool: the framework allocator was asked for device {}; devices 0 to {} are supported", device,
                    max_devices - 1));
  std::lock_guard guard(mutex_);
  auto& slot = backends_[static_cast<std::size_t>(device)];
  if (const backend* known = slot.load(std::memory_order_relaxed)) return *known;
  auto runtime =
      std::make_shared<backend>(config_.runtime == framework_runtime::host  ? host_backend()
                                : config_.runtime == framework_runtime::hip ? hip::device(device, config_.kind)
                                                                            : cuda::device(device, config_.kind));
  // Under a budget (no cap until refpool_allocator_set_device_limit), charged by the cache and
  // the private pools alike. The aliasing pointer keeps the runtime's backend alive.
  auto budget = std::make_shared<byte_budget>(cache_options::unlimited);
  auto made = std::make_unique<backend>(
      std::make_shared<limiting_resource>(std::shared_ptr<resource>(runtime, &runtime->underlying()), budget));
  budgets_[static_cast<std::size_t>(device)] = std::move(budget);
  slot.store(made.get(), std::memory_order_release);
  return *made.release();  // kept for the life of the process, like the runtime's own backends
}

}  // namespace refpool::detail
