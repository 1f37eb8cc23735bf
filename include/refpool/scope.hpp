// Scopes make a cache active on the current thread; guards suspend it.
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

#include <refpool/alloc_cache.hpp>

namespace refpool {

namespace detail {
class cache_state;
class plan_run;
struct slot;

/// One entry of the calling thread's stack of active scopes and guards.
struct scope_frame {
  scope_frame* previous = nullptr;
  cache_state* cache = nullptr;  ///< null: allocations go straight to the backend
  slot* lease = nullptr;         ///< the cache's per-scope state this frame allocates from
  bool owns_lease = false;       ///< false when an outer frame on this thread holds the lease
  plan_run* run = nullptr;       ///< the planned run this frame allocates through, if any
  bool owns_run = false;
  bool open = false;
};
}  // namespace detail

struct scope_options {
  /// Run the first N entries of scopes on this cache (counted per cache over all threads)
  /// uncached, so one-off warm-up allocations (autotuning workspaces) are never kept.
  std::size_t uncached_warmup_entries = 0;
  /// Non-empty: a planned scope (docs/design.md, "Planned scopes"). The first run under this key
  /// records its requests and their lifetimes; its end packs them into one arena; later runs
  /// with the same sequence get regions of that arena: no driver calls, memory held near the
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
class scope {
 public:
  explicit scope(alloc_cache& cache, scope_options options = {});
  ~scope();
  scope(const scope&) = delete;
  scope& operator=(const scope&) = delete;

  /// Ends the scope now; idempotent. Throws `scope_error` if it is not the innermost active
  /// scope or guard of the calling thread (the scope then stays open).
  void close();
  /// True when this entry serves allocations from the cache (false in warm-up or bypass).
  [[nodiscard]] bool caching() const noexcept { return frame_.lease != nullptr; }

 private:
  detail::scope_frame frame_;
};

/// Suspends the active cache on this thread: allocations inside go straight to the backend
/// and are freed on their last release, even though an outer scope is active. For results
/// that must outlive a scope by design. Same ordering rules as `scope`.
class uncached_guard {
 public:
  uncached_guard();
  ~uncached_guard();
  uncached_guard(const uncached_guard&) = delete;
  uncached_guard& operator=(const uncached_guard&) = delete;
  /// As scope::close().
  void close();

 private:
  detail::scope_frame frame_;
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
[[nodiscard]] bool caching_active() noexcept;

}  // namespace refpool
