// alloc_cache: the public face of cache_state, and stats printed at exit when asked.
#include <refpool/alloc_cache.hpp>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include <refpool/stats_format.hpp>

#include "cache/cache_state.hpp"
#include "config/env_config.hpp"

namespace refpool {

namespace {

// Caches alive now, for REFPOOL_CONF stats_at_exit:1 (only filled when that is set).
struct live_caches {
  std::mutex mutex;
  std::vector<const alloc_cache*> caches;
};
live_caches& registry() {
  static live_caches* instance = [] {
    auto* made = new live_caches;  // never destroyed: the atexit handler may run after statics
    std::atexit([] {
      std::lock_guard guard(registry().mutex);
      for (const alloc_cache* c : registry().caches)
        fmt::print(stderr, "refpool: cache {} at exit:\n{}", fmt::ptr(c), c->stats());
    });
    return made;
  }();
  return *instance;
}

}  // namespace

alloc_cache::alloc_cache() : alloc_cache(cache_options::from_environment()) {}

alloc_cache::alloc_cache(const cache_options& options)
    : state_(new detail::cache_state(options, detail::environment().no_caching)) {
  if (detail::environment().stats_at_exit) {
    std::lock_guard guard(registry().mutex);
    registry().caches.push_back(this);
  }
}

alloc_cache::~alloc_cache() {
  if (detail::environment().stats_at_exit) {
    std::lock_guard guard(registry().mutex);
    std::erase(registry().caches, this);
    fmt::print(stderr, "refpool: cache {} destroyed:\n{}", fmt::ptr(this), stats());
  }
  state_->close();
  state_->release();
}

cache_stats alloc_cache::stats() const { return state_->stats(); }
void alloc_cache::reset_peaks() noexcept { state_->reset_peaks(); }
std::size_t alloc_cache::reclaim(std::size_t keep_bytes) { return state_->reclaim(keep_bytes); }
void alloc_cache::set_max_idle_bytes(std::size_t bytes) { state_->set_max_idle_bytes(bytes); }
std::size_t alloc_cache::max_idle_bytes() const noexcept { return state_->max_idle_bytes(); }
std::string alloc_cache::summary() const { return refpool::summary(stats()); }
const rounding_policy& alloc_cache::rounding() const noexcept { return state_->rounding(); }

}  // namespace refpool
