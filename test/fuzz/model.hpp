// A reference model of refpool's caching rules, written from docs/design.md and the stats
// definitions rather than from lib/: which idle block a request gets (own slot, oldest, same
// stream first; then another slot's), where a released block goes, what reclaim, eviction and
// out-of-memory free (least recently released first), escapes, what a destroyed cache does,
// cache-level requests and steps, and planned scopes and steps (plan_model.hpp: which region of
// which plan a request gets, or why it falls back). It also predicts every backend call, and
// checks each against the tracking_resource's log as it goes, learning the addresses of new
// allocations from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <refpool/stats.hpp>
#include "support/fault_injection.hpp"

#include "plan_model.hpp"
#include "tracking_resource.hpp"

namespace refpool::test::fuzz {

/// Reports a mismatch between refpool and the model, with context, and aborts.
[[noreturn]] void fail(const std::string& what);

/// What an operation gave: success or the type of exception it threw.
enum class outcome : std::uint8_t {
  ok,
  size_error,
  shape_error,
  use_after_free,
  out_of_memory,
  backend_error,
  scope_error,
  config_error,
  invalid_argument,
  error,
  other,
};
const char* to_string(outcome o) noexcept;
/// A backend call, as mismatch reports print it.
std::string describe(const backend_event& e);

constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();
constexpr int threads = 2;  // 0: the main thread, 1: the helper
constexpr int backends = 2;

/// Rounding as documented in include/refpool/rounding.hpp.
struct model_rounding {
  enum class mode { exact, step, pow2 } how = mode::exact;
  std::size_t parameter = 1;
  /// False when rounding overflows (size_error).
  bool round(std::size_t bytes, std::size_t& out) const noexcept;
};

/// Where a block came from, and so where it goes at its last release.
enum class block_kind : std::uint8_t {
  cached,    ///< a cache's block: idle in its home slot
  direct,    ///< straight from the backend, no cache: freed
  uncached,  ///< allocate_uncached of cache `uncached_for` (recordings, warm-up steps): freed, counted
  region,    ///< a region of plan `plan` (request `region`): back to the plan
};

struct model_block {
  std::uint64_t gid = 0;  ///< the model's own number, unique over the input
  block_kind kind = block_kind::cached;
  int uncached_for = -1;  ///< uncached: the cache that counts it
  int plan = -1;          ///< region: its plan (model id) and request
  std::size_t region = 0;
  int run = -1;  ///< tracked by a planned run (a recording or a fallback): the run and entry
  std::size_t tracked = 0;
  void* ptr = nullptr;
  std::size_t capacity = 0;
  std::size_t requested = 0;
  int backend = 0;
  int cache = -1;        ///< model cache index (cached blocks), else -1
  int slot = -1;         ///< home slot in that cache
  std::uint64_t id = 0;  ///< creation number in its cache
  bool idle = false;
  std::uint64_t idle_since = 0, idle_seq = 0, epoch = 0;
  void* last_stream = nullptr;
  std::vector<void*> extra_streams;
  int refs = 0;
  std::uint64_t stamp = 0;  ///< the owner's pattern written into the buffer
};

struct model_slot {
  bool erased = false, leased = false, orphaned = false;
  bool ambient = false;  ///< a thread's slot for cache-level requests (leased until the thread ends)
  int last_thread = -1;
  std::uint64_t epoch = 1, live_in_epoch = 0, releases = 0;
  std::uint64_t hits = 0, misses = 0, steals = 0, unsafe_frees = 0, escapes = 0, cross_stream = 0;
  std::size_t live_blocks = 0, idle_blocks = 0, live_bytes = 0, idle_bytes = 0;
  /// Idle blocks by (backend, rounded bytes), highest id first: back() is the oldest.
  std::map<std::pair<int, std::size_t>, std::vector<std::uint64_t>> idle;
};

struct model_cache {
  model_rounding rounding;
  std::size_t max_idle = unlimited;
  bool auto_plans = true;  ///< a step without a key plans under the cache's own key
  bool closed = false;
  int ambient[2] = {-1, -1};  ///< each thread's cache-level slot, once it made a request
  // Steps: the epoch of cache-level requests is odd inside a step.
  std::uint64_t step_epoch = 0;
  bool step_open = false;
  bool step_uncached = false;  ///< a warm-up step: cache-level requests go uncached
  int step_run = -1;           ///< a planned step's run
  std::uint64_t steps = 0;
  std::uint64_t uncached_allocations = 0, extra_escapes = 0, extra_unsafe_frees = 0, ooms = 0;
  std::size_t uncached_live = 0;
  model_plan_store plans;
  std::vector<model_slot> slots;  ///< in creation order, as the cache iterates them
  std::vector<int> free_slots;
  std::uint64_t next_id = 1, clock = 1;
  std::uint64_t backend_allocations = 0, backend_frees = 0, evictions = 0, reclaimed = 0, oom_retries = 0,
                scope_entries = 0, uncached_entries = 0;
  std::size_t held = 0, peak = 0;
};

/// One entry of a thread's scope stack.
struct model_frame {
  bool guard = false;
  int cache = -1;  ///< model cache index (scopes)
  int lease = -1;  ///< slot index, -1: uncached
  bool owns = false;
  int run = -1;  ///< a planned scope's run (shared with nested scopes on the same cache)
  bool owns_run = false;
};

/// Fault injection of one backend, as failing_resource documents it, and its byte limit.
struct model_backend {
  std::size_t capacity = 0;  ///< limiting_resource's limit
  std::size_t outstanding = 0;
  std::uint64_t calls = 0, first = 0, count = 0;
  bool inject_backend_error = false;
  std::uint64_t injected = 0, limit_failures = 0;
};

class model {
 public:
  enum class backend_result { ok, out_of_memory, error };
  explicit model(event_log& log) : log_(log) {}

  model_backend be[backends];
  std::vector<model_cache> caches;
  std::vector<model_frame> frames[threads];
  std::map<std::uint64_t, model_block> blocks;

  int new_cache(model_rounding rounding, std::size_t max_idle, bool auto_plans);
  /// The alloc_cache is destroyed: its idle blocks are freed, slots in use are orphaned.
  void close_cache(int c);

  /// `key` non-empty: a planned scope.
  void enter_scope(int thread, int c, std::size_t warmup, const std::string& key = {});
  void enter_guard(int thread);
  /// `closer` closes frame `index` of `owner`'s stack: scope_error unless it is the innermost
  /// of the closer's own stack.
  outcome close_frame(int closer, int owner, std::size_t index);

  /// A request of `bytes` (> 0) on `thread`: through the innermost frame's lease, else direct.
  /// On success `gid` names the block (refs 1). On out_of_memory `oom_bytes` is the rounded size.
  outcome allocate(int thread, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                   std::size_t& oom_bytes);
  /// A request served without a cache (a cache-level request after its thread's teardown):
  /// straight to the backend, exactly `bytes`.
  outcome allocate_direct(int backend, std::size_t bytes, void* stream, std::uint64_t& gid, std::size_t& oom_bytes);
  void add_ref(std::uint64_t gid);
  void drop_ref(std::uint64_t gid, bool via_unsafe_free);
  void record_stream(std::uint64_t gid, void* stream);

  /// alloc_cache::allocate on `thread`: its cache-level slot, through the open step if any.
  outcome cache_allocate(int thread, int c, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                         std::size_t& oom_bytes);
  /// `thread`'s cache-level slot of cache `c`, leased now if it has none (a request in flight
  /// leased it before its cache was destroyed).
  void lease_ambient(int c, int thread) { ambient_slot(caches[static_cast<std::size_t>(c)], thread); }
  /// A step on cache `c`: scope_error if one is open.
  outcome open_step(int c, std::size_t warmup, const std::string& key);
  void end_step(int c);

  std::size_t reclaim(int c, std::size_t keep);
  void set_max_idle(int c, std::size_t bytes);

  [[nodiscard]] refpool::cache_stats stats(int c) const;
  /// Bytes of blocks of `backend` that the model thinks are allocated.
  [[nodiscard]] std::size_t allocated_bytes(int backend) const;

  /// Every backend call the model expected happened, and no other; arenas that must be gone are.
  void expect_no_more_events(const char* where);
  /// Bytes of arenas not yet freed, of `backend`.
  [[nodiscard]] std::size_t arena_bytes(int backend) const;

  std::uint64_t next_gid = 1;
  std::vector<model_plan> plans;
  std::vector<model_arena> arenas;
  std::vector<model_span_heap> span_heaps;  ///< of caches without segments: arenas' spans (model_span_heap.cpp)
  std::vector<model_run> runs;
  std::vector<int> active_runs;      ///< runs begun and not ended
  std::size_t first_live_arena = 0;  ///< arenas below are all freed
  model_plan_totals plan_totals;

 private:
  // (backend_result is public: plan_model uses it)
  backend_result backend_allocate(int backend, std::size_t bytes, void*& ptr);
  // A new block of `kind` with one handle (cached, direct, uncached, region), numbered and kept.
  model_block& add_held_block(block_kind kind, void* ptr, std::size_t capacity, std::size_t requested, int backend,
                              void* stream);
  void backend_free(const model_block& b);
  /// The next pending call past the order_streams that a free of a block with recorded streams makes first.
  [[nodiscard]] const backend_event* pending_free() const;
  const backend_event& next_event(const char* expected);
  /// The next call must be order_streams(producer -> consumer) on `backend`; `before` says what it
  /// comes before, for the message.
  void expect_order_streams(int backend, void* producer, void* consumer, const std::string& before);

  // The plain cache's request path (rounding, own slot, steal, backend with the OOM ladder).
  outcome slot_acquire(int c, int s, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                       std::size_t& oom_bytes);
  // cache_state::allocate_uncached: exact, from the backend, reclaiming on out-of-memory, counted.
  outcome uncached_acquire(int c, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                           std::size_t& oom_bytes);
  // A backend allocation with the cache's out-of-memory ladder (reclaim this backend's idle
  // blocks, retry once). `ptr` is set on success.
  backend_result allocate_or_reclaim(int c, int backend, std::size_t bytes, void*& ptr, bool count_oom);
  int ambient_slot(model_cache& c, int thread);
  void roll_epoch(model_slot& s, std::uint64_t epoch);

  // Planned runs (model_plans.cpp, model_plan_store.cpp).
  int begin_run(int c, const std::string& key, bool shared);
  outcome run_acquire(int run, int lease, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                      std::size_t& oom_bytes);
  outcome replay_one(int run, int lease, const model_request& request, std::uint64_t at, std::uint64_t& gid,
                     std::size_t& oom_bytes);
  outcome fallback(int run, int lease, const model_request& request, bool track, std::uint64_t& gid,
                   std::size_t& oom_bytes);
  void begin_with(model_run& r, const model_request& request);
  bool switch_to(model_run& r, const model_request& request, std::uint64_t at);
  void finish_run(int run);
  /// The detector's verdict on a run's end of `key`: 1 entered pass, 2 learns again, 0 neither.
  int observe_repeats(model_plan_store& store, int key, std::uint64_t fp, bool replayed);
  void enter_pass(int c, int key);
  void track(model_run& r, int run, std::uint64_t gid, const model_request& request, std::uint64_t at);
  void advance(model_run& r, std::uint64_t to);
  unsigned adopt(int c, int key, int made);  // plans (or pending recordings) it replaced or dropped
  bool add_plan(int c, int key, int made);
  void grow_and_install(int c, int key, int made, int old, std::size_t needed);
  void move_to_own_arena(int c, int key);
  void install(model_plan_store& store, int key, int plan);
  void drop_plan(model_plan_store& store, int key, std::size_t i);
  int make_plan(int c, std::vector<model_request> requests,
                const std::vector<std::pair<std::uint64_t, std::uint64_t>>& life);
  int copy_plan(int plan, int arena);
  bool new_arena(int c, int backend, void* stream, std::size_t bytes, int& arena);
  void put_back_region(model_block& b, bool via_unsafe_free);

  // Arenas as spans of a heap of spans alone (model_span_heap.cpp).
  model_span_heap& span_heap(int c, int backend);
  /// Bytes of the segments of heaps of spans (cache or backend -1: all).
  [[nodiscard]] std::size_t span_heap_bytes(int c, int backend) const;
  [[nodiscard]] std::size_t span_heap_free_bytes(const model_span_heap& h) const;
  void take_range(model_span_heap& h, std::size_t seg, std::size_t range, std::size_t offset, std::size_t bytes,
                  int arena);
  void free_range(model_span_heap& h, model_heap_segment& seg, std::size_t range, const std::vector<void*>& used_on);
  bool find_fit(model_span_heap& h, bool small, std::size_t bytes, std::size_t& seg, std::size_t& range) const;
  void yield_span(model_span_heap& h, int arena);
  void wait_for_span_streams(int arena, const std::vector<void*>& streams, const char* why);
  void yield_idle_spans(int c, int backend);
  backend_result carve_rounded(int c, int arena, std::size_t bytes);
  bool carve_with_retry(int c, int arena, std::size_t bytes, bool new_record);
  void reclaim_for_retry(int c, int backend);
  std::size_t trim_span_heap(int c, int backend, std::size_t keep);
  void free_segment(model_span_heap& h, std::size_t seg);
  void give_back_span(int arena);
  void idle_span(int arena);
  [[nodiscard]] bool arena_unpinned(int arena) const;
  bool take_arena(int arena);
  bool extend_span(int arena, std::size_t bytes);
  void extend_into_next(model_span_heap& h, model_heap_segment& seg, std::size_t range, std::size_t bytes, int arena);
  void observe_release(const model_block& b);
  void close_plans(int c);
  /// Accepts the deallocation of arenas that may go now, and checks those that must be gone.
  void settle_arenas(bool at_end_of_operation);
  [[nodiscard]] bool plan_held(int plan, bool counting_foreign) const;

  std::uint64_t take(model_slot& s, std::pair<int, std::size_t> key, void* stream);
  void mark_live(model_slot& s, model_block& b, bool hit);
  void add_idle(model_cache& c, model_slot& s, model_block& b);
  void remove_idle(model_slot& s, model_block& b);
  std::size_t idle_total(const model_cache& c) const;
  /// Frees least recently released idle blocks (of `backend`, or all when -1) while more than
  /// `keep` idle bytes match. Ties in release order are resolved by reading the log.
  std::size_t free_idle(int c, std::size_t keep, int backend, std::uint64_t& counter);
  std::size_t free_idle_blocks(int c, std::size_t keep, int backend, std::uint64_t& counter, std::size_t& idle_left);
  void enforce_limit(int c);
  void free_block(model_cache& c, std::uint64_t gid);  // to the backend, counted as a cache free
  int lease(model_cache& c, int thread);
  void end_lease(model_cache& c, int slot);
  void wait_for_streams(model_block& b, void* stream);

  event_log& log_;
};

}  // namespace refpool::test::fuzz
