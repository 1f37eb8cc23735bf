// What a thread holds of caches until it ends: the slots of its cache-level requests (one per
// cache, leased at its first request there) and one reference to the router of the step it last
// sent a request to (cache_state::step_router). Both go back when the thread's thread_local
// destructors run. A request after that (from a thread_local destroyed later, a pthread key's
// destructor, or a static destructor: glibc destroys the main thread's thread_locals before static
// objects) is served without a cache, and nothing is kept for a thread that could not give it back.
#include "cache/thread_holdings.hpp"

#include <utility>
#include <vector>

#include "cache/cache_state.hpp"

namespace refpool::detail {

__thread cache_state* ambient_cache __attribute__((tls_model("initial-exec"))) = nullptr;
__thread slot* ambient_lease __attribute__((tls_model("initial-exec"))) = nullptr;
__thread const cache_state* kept_step_cache __attribute__((tls_model("initial-exec"))) = nullptr;
__thread std::uint64_t kept_step_epoch __attribute__((tls_model("initial-exec"))) = 0;
__thread request_router* kept_step_router __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

// Set when the thread's holdings went back: from then on it holds nothing.
__thread bool holdings_gone __attribute__((tls_model("initial-exec"))) = false;

struct thread_holdings {
  std::vector<std::pair<cache_state*, slot*>> leases;  // each holds its cache

  ~thread_holdings() {
    holdings_gone = true;  // first: what the releases below may run sees the thread as gone
    ambient_cache = nullptr;
    ambient_lease = nullptr;
    kept_step_cache = nullptr;
    if (request_router* r = std::exchange(kept_step_router, nullptr)) r->release_router();
    for (const auto& [cache, s] : leases) {
      cache->give_back_ambient(s);
      cache->release();
    }
  }
};
thread_local thread_holdings holdings;

/// The calling thread's holdings (made at the first call, which registers their destructor), or
/// null once they went back.
thread_holdings* holdings_of_this_thread() noexcept { return holdings_gone ? nullptr : &holdings; }

// The thread that loads the library (the main thread, for a program linked with it) makes its
// holdings now, so that they go with its other thread_locals at exit(), before static destructors:
// a request from a static destructor then finds them gone. Made at that request instead, they
// would register a destructor that never runs, and keep a lease of a thread that has ended.
[[maybe_unused]] const bool loading_thread_holds = holdings_of_this_thread() != nullptr;

}  // namespace

slot* cache_state::lease_ambient_for_thread() {
  thread_holdings* held = holdings_of_this_thread();
  if (held == nullptr) return nullptr;  // the thread's teardown began: uncached
  auto& mine = held->leases;
  for (const auto& [cache, s] : mine) {
    if (cache == this) {
      ambient_cache = this;
      ambient_lease = s;
      return s;
    }
  }
  // Leases on destroyed caches are given back first, so a long-lived thread keeps nothing of them.
  ambient_cache = nullptr;
  std::erase_if(mine, [](const std::pair<cache_state*, slot*>& lease) {
    if (!lease.first->closed()) return false;
    lease.first->give_back_ambient(lease.second);
    lease.first->release();
    return true;
  });
  mine.reserve(mine.size() + 1);
  slot* s = lease_ambient();
  if (s == nullptr) return nullptr;
  retain();
  mine.emplace_back(this, s);
  ambient_cache = this;
  ambient_lease = s;
  return s;
}

router_ref cache_state::thread_step_router(std::uint64_t epoch) noexcept {
  router_ref fresh = retain_step_router();
  // Kept only when it is the router of the step this epoch names: a step begun (odd) and not
  // ended since (a step ending now passes its router to this call only), and while the thread can
  // still give it back.
  if (!fresh || epoch % 2 == 0 || step_epoch_.load(std::memory_order_acquire) != epoch) return fresh;
  if (holdings_of_this_thread() == nullptr) return fresh;
  fresh->retain_router();
  request_router* const dropped = std::exchange(kept_step_router, fresh.get());
  kept_step_cache = this;
  kept_step_epoch = epoch;
  if (dropped != nullptr) dropped->release_router();  // may end an old run
  return fresh;
}

}  // namespace refpool::detail
