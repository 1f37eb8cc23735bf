// What the floors above plug into a cache, so that the cache routes to them without knowing them
// (docs/design.md, "The owner model and where the code lives"): a router that serves a planned
// scope's or step's requests, a listener told before the plain path grows, and an extension
// attached to the cache (the plan store). With region_owner and release_observer (block.hpp,
// region_block.hpp) these are all lib/plan sees of the cache's requests.
#pragma once

#include <cstddef>
#include <utility>

#include <refpool/stats.hpp>
#include <refpool/types.hpp>

namespace refpool::detail {

class backend_state;
struct block;
struct slot;

/// Serves the requests of a planned scope or step (lib/plan implements it), or of a warm-up
/// step, so the core routes to them without knowing them. Counted: a step's router is reached
/// by any thread through the cache (step_router), so it goes with its last reference, never
/// with the step that made it (docs/design.md, "Lifetimes"). Once its step or scope ended it
/// holds no count on its cache or a backend (a thread may keep it long): a late request comes
/// through the cache, whose caller holds it.
class request_router {
 public:
  /// A live block of `bytes` for `stream`. `lease` is the slot plain-cache fallbacks come from
  /// (owned by the calling thread), or null when the caller runs uncached.
  virtual block* acquire(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) = 0;
  virtual void retain_router() noexcept = 0;
  virtual void release_router() noexcept = 0;

 protected:
  ~request_router() = default;
};

/// A router for the length of a call through it: one counted reference, or one borrowed from a
/// reference the calling thread keeps (cache_state::step_router).
class router_ref {
 public:
  router_ref() noexcept = default;
  explicit router_ref(request_router* adopted) noexcept : router_(adopted), counted_(adopted != nullptr) {}
  static router_ref borrowed(request_router* kept) noexcept {
    router_ref r;
    r.router_ = kept;
    return r;
  }
  router_ref(router_ref&& other) noexcept
      : router_(std::exchange(other.router_, nullptr)), counted_(std::exchange(other.counted_, false)) {}
  router_ref(const router_ref&) = delete;
  router_ref& operator=(const router_ref&) = delete;
  router_ref& operator=(router_ref&&) = delete;
  ~router_ref() {
    if (counted_) router_->release_router();
  }
  request_router* get() const noexcept { return router_; }
  request_router* operator->() const noexcept { return router_; }
  explicit operator bool() const noexcept { return router_ != nullptr; }

 private:
  request_router* router_ = nullptr;
  bool counted_ = false;
};

/// Told before the plain path asks a backend for more memory on this thread (a miss that grows a
/// segment heap or allocates a block). A planned run without a plan listens while the plain cache
/// serves it, so that its key's idle arena can lend its memory first (plan_run::before_growth).
class growth_listener {
 public:
  /// Returns a growth step: while a lender's memory is given back, the plain path may grow by
  /// this much at once (few driver calls for the bytes it is about to need again); 0: as usual.
  virtual std::size_t before_growth(backend_state& backend) noexcept = 0;

 protected:
  ~growth_listener() = default;
};

/// The calling thread's listener (null: none); set around a planned run's plain-cache request.
inline thread_local growth_listener* growth_listener_on_thread = nullptr;

/// Makes `listener` the calling thread's growth listener while it lives (null: none), then restores the previous one.
class listening_for_growth {
 public:
  explicit listening_for_growth(growth_listener* listener) noexcept
      : outer_(std::exchange(growth_listener_on_thread, listener)) {}
  ~listening_for_growth() { growth_listener_on_thread = outer_; }
  listening_for_growth(const listening_for_growth&) = delete;
  listening_for_growth& operator=(const listening_for_growth&) = delete;

 private:
  growth_listener* outer_;
};

/// Tells the calling thread's growth listener, if any, that `backend` is about to be asked for
/// memory; its growth step (0 without one).
inline std::size_t before_growth(backend_state& backend) noexcept {
  if (growth_listener* l = growth_listener_on_thread) [[unlikely]]
    return l->before_growth(backend);
  return 0;
}

/// State that other parts attach to a cache (the plans): closed with it, counted into its stats.
class cache_extension {
 public:
  virtual ~cache_extension() = default;
  virtual void close() noexcept = 0;
  virtual void add_counters(cache_stats& out) const = 0;
  /// Restarts the extension's peaks from the current values (cache_state::reset_peaks).
  virtual void reset_peaks() noexcept = 0;
  /// Out of memory on `backend`: gives back what the extension holds without use now. Returns the bytes.
  virtual std::size_t release_unused(const backend_state& backend) noexcept = 0;
};

}  // namespace refpool::detail
