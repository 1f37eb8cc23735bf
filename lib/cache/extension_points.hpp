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

/// State that other parts attach to a cache (the plans): closed with it, counted into its stats.
class cache_extension {
 public:
  virtual ~cache_extension() = default;
  virtual void close() noexcept = 0;
  virtual void add_counters(cache_stats& out) const = 0;
  /// Restarts the extension's peaks from the current values (cache_state::reset_peaks).
  virtual void reset_peaks() noexcept = 0;
};

}  // namespace refpool::detail
