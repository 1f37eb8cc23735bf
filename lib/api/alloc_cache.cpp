// alloc_cache: the public face of cache_state, and stats printed at exit when asked.
#include <refpool/alloc_cache.hpp>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cache/cache_state.hpp"
#include "config/env_config.hpp"

namespace refpool {

namespace {

void print_stats(const alloc_cache& cache, std::string_view when) {
  const cache_stats s = cache.stats();
  const bool full = detail::environment().stats_at_exit == detail::exit_stats::full;
  fmt::print(stderr, "refpool: cache {} {}:\n{}", fmt::ptr(&cache), when, full ? to_string(s) : summary(s));
}

// Caches alive now, for REFPOOL_CONF stats_at_exit (only filled when that is on).
struct live_caches {
  std::mutex mutex;
  std::vector<const alloc_cache*> caches;
};
live_caches& registry() {
  static live_caches* instance = [] {
    auto* made = new live_caches;  // never destroyed: the atexit handler may run after statics
    std::atexit([] {
      std::lock_guard guard(registry().mutex);
      for (const alloc_cache* c : registry().caches) print_stats(*c, "at exit");
    });
    return made;
  }();
  return *instance;
}

}  // namespace

alloc_cache::alloc_cache() : alloc_cache(cache_options::from_environment()) {}

alloc_cache::alloc_cache(const cache_options& options)
    : state_(new detail::cache_state(options, detail::environment().no_caching)) {
  if (detail::environment().stats_at_exit != detail::exit_stats::off) {
    std::lock_guard guard(registry().mutex);
    registry().caches.push_back(this);
  }
}

alloc_cache::~alloc_cache() {
  if (detail::environment().stats_at_exit != detail::exit_stats::off) {
    std::lock_guard guard(registry().mutex);
    std::erase(registry().caches, this);
    print_stats(*this, "destroyed");
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
