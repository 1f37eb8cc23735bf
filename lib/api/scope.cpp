// Scopes, guards and steps: the per-thread stack of frames that allocate() consults, and the
// cache-level step that covers every thread's cache-level requests.
#include <refpool/error.hpp>
#include <refpool/scope.hpp>

#include <atomic>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "access.hpp"
#include "cache/cache_state.hpp"
#include "cache/scope_frame.hpp"
#include "config/env_config.hpp"
#include "plan/run.hpp"

namespace refpool {

namespace detail {

/// What a scope or guard owns: its frame on the thread's stack and its planned run.
struct scope_state {
  scope_frame frame;
  plan_run* run = nullptr;  ///< owned: the frame's router when this scope planned
  pass_ticket pass;         ///< a planned scope of a key in pass: no router
};

/// Serves every request of an uncached (warm-up) step straight from the backend, for its cache.
/// Counted like every step router: a late request may still come through it after the step.
/// It holds its cache until its step ends (end()); a late request's caller holds the cache then.
class uncached_router final : public request_router, public ref_counted<uncached_router> {
 public:
  explicit uncached_router(cache_state& cache) : cache_(cache) { cache.retain(); }
  block* acquire(slot*, backend_state& backend, std::size_t bytes, stream_ref stream) override {
    return cache_.allocate_uncached(backend, bytes, stream);
  }
  void retain_router() noexcept override { retain(); }
  void release_router() noexcept override { release(); }
  /// Its step ended (once, by the step, which still holds the cache).
  void end() noexcept {
    ended_ = true;
    cache_.release();
  }

 private:
  friend class ref_counted<uncached_router>;
  ~uncached_router() {
    if (!ended_) cache_.release();  // a step that never opened
  }
  cache_state& cache_;
  bool ended_ = false;  // written before the step drops its reference, read after the last one
};

/// What a step owns.
struct step_state {
  explicit step_state(cache_state& c) : cache(c) {}
  cache_state& cache;                   ///< retained while open
  plan_run* run = nullptr;              ///< a reference to the router of a planned step
  uncached_router* uncached = nullptr;  ///< a reference to the router of a warm-up step
  pass_ticket pass;                     ///< a planned step of a key in pass: no router
  std::atomic<bool> open{true};

  /// Drops the step's references to its routers.
  void release_routers() noexcept {
    if (uncached != nullptr) std::exchange(uncached, nullptr)->release();
    if (run != nullptr) std::exchange(run, nullptr)->release();
  }
};

namespace {

void push(scope_frame& frame) noexcept {
  frame.previous = current_frame;
  frame.open = true;
  current_frame = &frame;
}

// Unlinks `frame` if it is the innermost open frame of this thread; throws scope_error if not.
void pop(scope_frame& frame, std::string_view what) {
  if (!frame.open) return;
  if (current_frame != &frame) {
    bool on_this_thread = false;
    for (const scope_frame* f = current_frame; f != nullptr; f = f->previous) on_this_thread |= f == &frame;
    throw scope_error(
        fmt::format("refpool: {} closed out of order: {}", what,
                    on_this_thread ? "a scope or guard opened after it on this thread is still open; close that first"
                                   : "it is not open on this thread (scopes must end on the thread that opened them)"));
  }
  current_frame = frame.previous;
  frame.open = false;
}

[[noreturn]] void terminate_with(const scope_error& e) noexcept {
  fmt::print(stderr, "{}\n", e.what());
  std::fflush(stderr);
  std::terminate();
}

/// Closes a scope or guard from its destructor, which cannot throw a broken order.
template <class Closable>
void close_from_destructor(Closable& closable) noexcept {
  try {
    closable.close();
  } catch (const scope_error& e) {
    terminate_with(e);
  }
}

/// A planned run's end: it makes or replaces its key's plan, then goes.
void finish(plan_run*& run) noexcept {
  if (plan_run* ending = std::exchange(run, nullptr)) {
    ending->finish();
    ending->release();
  }
}

}  // namespace

}  // namespace detail

scope::scope(alloc_cache& cache, scope_options options) : state_(new detail::scope_state) {
  detail::scope_frame& frame = state_->frame;
  detail::cache_state& state = detail::access::state(cache);
  bool bypass = false;
  try {
    bypass = detail::environment().no_caching;
  } catch (...) {
    delete state_;
    throw;
  }
  frame.cache = &state;
  bool nested = false;
  for (const detail::scope_frame* f = detail::current_frame; f != nullptr && !nested; f = f->previous) {
    if (f->cache == &state) {  // nested on a cache already active here: share its state
      frame.lease = f->lease;
      frame.router = f->router;
      nested = true;
    }
  }
  if (!nested) {
    const bool warmup = state.count_entry(bypass ? static_cast<std::size_t>(-1) : options.uncached_warmup_entries);
    try {
      if (!warmup) {
        frame.lease = state.lease();
        frame.owns_lease = frame.lease != nullptr;
      }
      if (frame.lease != nullptr && !options.plan.empty()) {
        state_->run = detail::plan_run::open(state, options.plan, /*shared=*/false, state_->pass);
        frame.router = state_->run;
      }
    } catch (...) {
      if (frame.owns_lease) state.end_lease(frame.lease);
      delete state_;
      throw;
    }
  }
  state.retain();
  detail::push(frame);
}

scope::~scope() {
  detail::close_from_destructor(*this);
  delete state_;
}

void scope::close() {
  detail::scope_frame& frame = state_->frame;
  if (!frame.open) return;
  detail::pop(frame, "a refpool scope was");
  detail::finish(state_->run);
  state_->pass.end();
  frame.router = nullptr;
  if (frame.owns_lease) frame.cache->end_lease(frame.lease);
  frame.cache->release();
  frame.lease = nullptr;
  frame.owns_lease = false;
}

bool scope::caching() const noexcept { return state_->frame.lease != nullptr; }

uncached_guard::uncached_guard() : state_(new detail::scope_state) { detail::push(state_->frame); }

uncached_guard::~uncached_guard() {
  detail::close_from_destructor(*this);
  delete state_;
}

void uncached_guard::close() { detail::pop(state_->frame, "a refpool uncached_guard was"); }

step::step(alloc_cache& cache, scope_options options) : state_(new detail::step_state(detail::access::state(cache))) {
  detail::cache_state& state = state_->cache;
  try {
    detail::environment();  // a bad REFPOOL_CONF fails here
    detail::request_router* router = nullptr;
    if (state.steps_begun() < options.uncached_warmup_entries) {
      state_->uncached = new detail::uncached_router(state);
      router = state_->uncached;
    } else if (const std::string_view key = state.step_plan_key(options.plan); !key.empty()) {
      state_->run = detail::plan_run::open(state, key, /*shared=*/true, state_->pass);  // any thread serves a step
      router = state_->run;
    }
    state.begin_step(router);
  } catch (...) {
    state_->release_routers();
    delete state_;
    throw;
  }
  state.retain();
}

step::~step() {
  end();
  delete state_;
}

void step::end() noexcept {
  if (!state_->open.exchange(false)) return;
  state_->cache.end_step();
  if (state_->run != nullptr) state_->run->finish();  // late requests go to the plain cache
  state_->pass.end();
  if (state_->uncached != nullptr) state_->uncached->end();
  state_->release_routers();  // requests in flight hold their own references
  state_->cache.release();
}

bool caching_active() noexcept {
  const detail::scope_frame* f = detail::current_frame;
  return f != nullptr && f->lease != nullptr;
}

}  // namespace refpool
