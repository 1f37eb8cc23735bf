// What a thread holds of caches until it ends: the slots of its cache-level requests (one per
// cache, leased at its first request there) and one reference to the router of the step it last
// sent a request to (cache_state::step_router). Both go back at the thread's end, from a pthread
// key's destructor: those run after the thread's thread_local destructors (requests from these are
// served and given back too), and run again for holdings that another key's destructor made (a
// thread_local made there would register a destructor that never runs, and keep its leases). The
// thread that loads the library (the main thread, for a program linked with it) also gives them
// back from a thread_local destructor: exit() runs the main thread's thread_local destructors,
// before static destructors, and no key destructor. A request after the holdings went (from a
// later destructor of any kind, or a static destructor) is served without a cache.
#include "cache/thread_holdings.hpp"

#include <dlfcn.h>
#include <pthread.h>

#include <memory>
#include <new>
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

struct thread_holdings {
  std::vector<std::pair<cache_state*, slot*>> leases;  // each holds its cache
};

// The thread's holdings (on the heap, made at its first need), and whether they went back: from
// then on the thread holds nothing. Plain variables: nothing of theirs is destroyed at the thread's end.
__thread thread_holdings* holdings __attribute__((tls_model("initial-exec"))) = nullptr;
__thread bool holdings_gone __attribute__((tls_model("initial-exec"))) = false;

void give_back_holdings() noexcept {
  holdings_gone = true;  // first: what the releases below may run sees the thread as gone
  ambient_cache = nullptr;
  ambient_lease = nullptr;
  kept_step_cache = nullptr;
  if (request_router* r = std::exchange(kept_step_router, nullptr)) r->release_router();
  const std::unique_ptr<thread_holdings> held(std::exchange(holdings, nullptr));
  if (held == nullptr) return;
  for (const auto& [cache, s] : held->leases) {
    cache->end_ambient_lease(s);
    cache->release();
  }
}

// The key whose destructor gives a thread's holdings back; its value is the thread's holdings.
// The library stays loaded once a key destructor of its own may run at a thread's end (a
// thread_local's destructor keeps its library loaded the same way).
bool exit_key_made(pthread_key_t& key) noexcept {
  if (pthread_key_create(&key, [](void*) { give_back_holdings(); }) != 0) return false;
  Dl_info self;
  if (dladdr(reinterpret_cast<void*>(&give_back_holdings), &self) != 0 && self.dli_fname != nullptr)
    (void)dlopen(self.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);  // never closed
  return true;
}

/// The calling thread's holdings (made at the first call), or null once they went back (or when
/// they cannot be made: the request is then served without a cache).
thread_holdings* holdings_of_this_thread() noexcept {
  if (holdings_gone) return nullptr;
  if (holdings != nullptr) [[likely]]
    return holdings;
  static pthread_key_t exit_key;
  static const bool key_made = exit_key_made(exit_key);
  if (!key_made) return nullptr;
  auto made = std::unique_ptr<thread_holdings>(new (std::nothrow) thread_holdings);
  if (made == nullptr || pthread_setspecific(exit_key, made.get()) != 0) return nullptr;
  holdings = made.release();
  return holdings;
}

// The loading thread's holdings go back with its thread_locals (see the top of this file). Made
// while the library loads, so that its destructor is registered before exit() runs them.
struct loading_thread_exit {
  bool armed = false;
  ~loading_thread_exit() {
    if (armed) give_back_holdings();
  }
};
thread_local loading_thread_exit loading_thread_gives_back;
[[maybe_unused]] const bool loading_thread_armed = (loading_thread_gives_back.armed = true);

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
    lease.first->end_ambient_lease(lease.second);
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
  if (!fresh || epoch % 2 == 0 || step_.epoch.load(std::memory_order_acquire) != epoch) return fresh;
  if (holdings_of_this_thread() == nullptr) return fresh;
  fresh->retain_router();
  request_router* const dropped = std::exchange(kept_step_router, fresh.get());
  kept_step_cache = this;
  kept_step_epoch = epoch;
  if (dropped != nullptr) dropped->release_router();  // may end an old run
  return fresh;
}

}  // namespace refpool::detail
