// Scopes make a cache active on the current thread; guards suspend it; steps mark iterations of
// work that spans threads.
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

#include <refpool/alloc_cache.hpp>
#include <refpool/detail/export.hpp>

namespace refpool {

namespace detail {
struct scope_state;
struct step_state;
}  // namespace detail

/// How a scope or step runs.
struct scope_options {
  /// Run the first N entries of scopes (or the first N steps) on this cache, counted per cache,
  /// uncached, so one-off warm-up allocations (autotuning workspaces) are never kept.
  std::size_t uncached_warmup_entries = 0;
  /// Non-empty: planned (docs/design.md, "Planned scopes"). A run under this key with no plan
  /// for its sequence is served by the plain cache and records its requests and their lifetimes;
  /// a plan (the requests packed into one arena) is made when a recorded sequence repeats, at
  /// the end of its second run (at its first while the key's arena is lent: see the doc). Later
  /// runs with that sequence get regions of the arena: no driver calls, memory held near the
  /// recorded peak of live bytes. A request whose bytes a live handle can still reach, or a run
  /// that diverges, falls back to the normal cache. The key's text is copied.
  std::string_view plan;
};

/// Makes `cache` the active cache on this thread until the scope ends. Scopes nest; the
/// innermost wins; a nested scope on the cache an outer scope already uses shares its state,
/// so escapes are counted when the outermost of them ends.
///
/// Scopes end in reverse order on the thread that opened them. `close()` throws `scope_error`
/// when that order is broken; the destructor, which cannot throw, prints the error and calls
/// std::terminate (as std::thread does when destroyed joinable).
///
/// With REFPOOL_NO_CACHING=1 in the environment every scope runs uncached.
class REFPOOL_API scope {
 public:
  /// Throws `config_error` (bad REFPOOL_CONF) and std::bad_alloc.
  [[nodiscard]] explicit scope(alloc_cache& cache, scope_options options = {});
  ~scope();
  scope(const scope&) = delete;
  scope& operator=(const scope&) = delete;

  /// Ends the scope now; idempotent. Throws `scope_error` if it is not the innermost active
  /// scope or guard of the calling thread (the scope then stays open).
  void close();
  /// True when this entry serves allocations from the cache (false in warm-up or bypass).
  [[nodiscard]] bool caching() const noexcept;

 private:
  detail::scope_state* state_;
};

/// Suspends the active cache on this thread: allocations inside go straight to the backend
/// and are freed on their last release, even though an outer scope is active. For results
/// that must outlive a scope by design. Same ordering rules as `scope`.
class REFPOOL_API uncached_guard {
 public:
  [[nodiscard]] uncached_guard();
  ~uncached_guard();
  uncached_guard(const uncached_guard&) = delete;
  uncached_guard& operator=(const uncached_guard&) = delete;
  /// As scope::close().
  void close();

 private:
  detail::scope_state* state_;
};

/// One iteration of work on a cache that may run on several threads (PyTorch runs backward on
/// its autograd thread; data loaders and communication threads allocate too). While a step is
/// open, every request made through `alloc_cache::allocate` (and the C framework entry points)
/// on any thread belongs to it: buffers still referenced when it ends are counted as escapes,
/// and the step is planned (under `options.plan`, or with no key under the cache's own key when
/// its `auto_plans` option is on, the default): its requests, in the order they arrive from
/// all threads, are recorded and replayed like a planned scope's (a fixed order, such as forward
/// on one thread then backward on another, replays; an order that varies diverges and falls back
/// to the cache). Requests made inside a thread's own `scope` go to that scope, not the step.
///
/// Thread safety: a step may be ended on any thread (once; later calls do nothing). Steps of one
/// cache do not nest: opening a second one while one is open throws `scope_error`.
class REFPOOL_API step {
 public:
  /// Throws `scope_error` (a step is open on `cache`), `config_error`, std::bad_alloc.
  [[nodiscard]] explicit step(alloc_cache& cache, scope_options options = {});
  /// Ends the step if it is still open.
  ~step();
  step(const step&) = delete;
  step& operator=(const step&) = delete;

  /// Ends the step now (any thread); idempotent.
  void end() noexcept;

 private:
  detail::step_state* state_;
};

/// Runs `f()` inside a scope on `cache` and returns its result.
template <class F>
decltype(auto) cached(alloc_cache& cache, F&& f) {
  scope s(cache);
  return std::forward<F>(f)();
}

/// Same, with scope options.
template <class F>
decltype(auto) cached(alloc_cache& cache, scope_options options, F&& f) {
  scope s(cache, options);
  return std::forward<F>(f)();
}

/// Runs `f()` inside an uncached_guard and returns its result.
template <class F>
decltype(auto) uncached(F&& f) {
  uncached_guard g;
  return std::forward<F>(f)();
}

/// True when an allocation on this thread would go through a cache now.
[[nodiscard]] REFPOOL_API bool caching_active() noexcept;

}  // namespace refpool
