// The internals of an alloc_cache: its slots, counters and the paths that move blocks between
// live, idle and their block source (block_source.hpp: whole blocks from the backend, or segment
// pieces), which owns their memory and its accounting. The hit path (acquire, release) is in
// hit_path.hpp (its inline fast part) and hit_path.cpp; the slow paths in cache_state.cpp (leases,
// steps, releases from other threads, close), cache_misses.cpp (steal, miss, uncached),
// cache_reclaim.cpp (reclaim, limits), cache_stats.cpp and cache_segments.cpp (idle pieces in slots).
//
// Locks. `mutex_` guards the slot list, leases, steps and block homes during steals; the segment
// source keeps the list of segment heaps (segment_source.hpp), guarded by this same mutex (it
// holds a reference to it). Every thread that touches a slot it does not own (an intruder) holds mutex_
// first, then the slot's owner_lock; the owner never waits for mutex_ while inside its slot. A
// segment heap's lock (cache_heap.hpp) is never taken under a slot's lock, and comes after
// mutex_ where both are held. No backend call is made under mutex_ or a slot's lock.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <refpool/cache_options.hpp>
#include <refpool/stats.hpp>
#include <refpool/types.hpp>

#include "cache/block.hpp"
#include "cache/cache_parts.hpp"
#include "cache/cache_counters.hpp"
#include "cache/extension_points.hpp"
#include "cache/idle_limit.hpp"
#include "cache/memory_map.hpp"
#include "cache/piece_units.hpp"
#include "cache/reserved_counter.hpp"
#include "cache/segment_source.hpp"
#include "cache/slot.hpp"
#include "cache/whole_blocks.hpp"
#include "ref_counted.hpp"

namespace refpool::detail {

class cache_state;

// The calling thread's reference to the router of the step (of one cache, identified by the
// cache's step epoch) it last sent a request to (cache_state::step_router). Step epochs are unique
// in the process (begin_step), so `kept_step_cache` (compared, never followed) cannot match a step
// of another cache made at the same address; a router whose step ended holds neither its cache nor
// a backend, so a thread that makes no more steps keeps nothing of them. Plain initial-exec
// variables, read on every step request without a call (a thread_local with a destructor is
// reached through __tls_get_addr); given back when the thread ends (thread_holdings.cpp).
extern __thread const cache_state* kept_step_cache __attribute__((tls_model("initial-exec")));
extern __thread std::uint64_t kept_step_epoch __attribute__((tls_model("initial-exec")));
extern __thread request_router* kept_step_router __attribute__((tls_model("initial-exec")));  // counted

class cache_state : public ref_counted<cache_state> {
 public:
  cache_state(const cache_options& options, bool bypass);

  /// The alloc_cache is being destroyed: free idle blocks, orphan slots still in use.
  void close() noexcept;
  [[nodiscard]] bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  // ---- scopes -------------------------------------------------------------------------------
  /// A slot for a scope entered on the calling thread; null when the cache is closed.
  slot* lease();
  /// The scope that leased `s` ended (on its thread): count its escapes, make `s` available.
  void end_lease(slot* s) noexcept;
  /// Counts a scope entry; true if it falls in the first `warmup` entries (run uncached).
  bool count_entry(std::size_t warmup) noexcept;

  // ---- cache-level allocations and steps ------------------------------------------------------
  /// The calling thread's slot for allocations through this cache without a scope, leased at
  /// first use until the thread ends; null when the cache is closed, or once the thread's
  /// holdings went back at its end (thread_holdings.cpp): the request then runs uncached.
  inline slot* ambient_slot();  // hit_path.hpp
  /// A new slot for the calling thread's cache-level allocations; null when closed.
  slot* lease_ambient();
  /// The thread of an ambient slot ends.
  void end_ambient_lease(slot* s) noexcept;
  /// The router of the open step (planned or warm-up), if any, with a reference held for the
  /// caller: cache-level allocations go through it, and may still do so after the step ended.
  /// The calling thread keeps one reference to the router of the step it last called (until its
  /// next request finds another step, or it exits), so a step's requests count no reference.
  [[nodiscard]] router_ref step_router() noexcept {
    if (step_.router.load(std::memory_order_relaxed) == nullptr) [[likely]]
      return {};
    const std::uint64_t epoch = step_.epoch.load(std::memory_order_acquire);
    if (kept_step_cache == this && kept_step_epoch == epoch) [[likely]]
      return router_ref::borrowed(kept_step_router);
    return thread_step_router(epoch);
  }
  /// Steps begun so far.
  [[nodiscard]] std::uint64_t steps_begun() const noexcept { return counters_.steps.load(std::memory_order_relaxed); }
  /// Opens a step (throws scope_error if one is open); `router`, if any, serves its requests
  /// (the cache holds a reference to it until the step ends).
  void begin_step(request_router* router);
  /// Closes the open step: escapes of cache-level allocations made in it are counted.
  void end_step() noexcept;

  // ---- the hit path (hit_path.hpp, hit_path.cpp) ----------------------------------------------
  /// The cache key of a request: rounded by the cache's policy, then (where this cache carves
  /// the backend's blocks from segments) up to the segment heap's piece unit, so that every
  /// block of a key has the key's size, pieces included.
  [[nodiscard]] block_key key_of(const backend_state& backend, std::size_t bytes) const {
    std::size_t rounded = settings_.rounding.round(bytes);
    const std::size_t unit = piece_unit(backend, settings_.segments);  // 1: plain blocks
    if (rounded > std::numeric_limits<std::size_t>::max() - (unit - 1)) [[unlikely]]
      throw_piece_rounding_overflow(rounded, unit);
    rounded = (rounded + unit - 1) & ~(unit - 1);
    return {&backend, backend.device(), backend.kind(), backend.alignment(), rounded};
  }
  /// The common hit, inline-sized: the oldest idle block of the slot's most recent key, last
  /// used on `stream`, with nothing pending; null otherwise (then acquire() does the request).
  /// Caller owns `s`. Sets neither `requested` nor the handle count.
  inline block* try_hit(slot& s, const block_key& key, stream_ref stream) noexcept;
  /// A live block for `key` and `stream`, from `s`'s idle blocks, another slot's, or the backend (reclaiming
  /// idle blocks and retrying once on out-of-memory). Caller owns `s`. Sets the handle count and `requested`.
  block* acquire(slot& s, backend_state& backend, const block_key& key, std::size_t bytes, stream_ref stream);
  /// Puts a released block back idle in the common case: on the slot's own thread, nothing
  /// pending, no idle limit. False: not done (put_back_cached does it).
  inline bool try_put_back(block* b, bool via_unsafe_free) noexcept;
  /// The last handle of cached block `b` went away (any thread): back idle in its home slot
  /// (through its hand-off list from another thread), or to its source if the slot is orphaned.
  void put_back_cached(block* b, bool via_unsafe_free) noexcept;

  // ---- taking idle bytes back at their address (take_at.cpp) ----------------------------------
  /// The idle bytes at `address` that a request of `key` gets, live again for `stream`, homed in
  /// `s` (an idle block of `key` there, as a hit; else idle pieces and free bytes there, carved as
  /// a miss: take_at.cpp). Null when nothing of the cache lies idle there; invalid_argument naming
  /// the bytes in use when some are (nothing changed either way). Caller owns `s`; `where` names
  /// the caller in messages. Sets neither `requested` nor the handle count.
  block* take_at(slot& s, backend_state& backend, const block_key& key, std::uintptr_t address, stream_ref stream,
                 std::string_view where);
  /// An idle block of the cache starting at `address` (any key): its capacity (0: none) and the
  /// backend it came from (another device's, say).
  struct idle_block_found {
    std::size_t capacity = 0;
    const backend_state* backend = nullptr;
  };
  [[nodiscard]] idle_block_found idle_block_at(std::uintptr_t address);

  // ---- what alloc_cache offers --------------------------------------------------------------------
  [[nodiscard]] cache_stats stats() const;
  void reset_peaks() noexcept;
  std::size_t reclaim(std::size_t keep_bytes);
  void set_max_idle_bytes(std::size_t bytes);
  [[nodiscard]] std::size_t max_idle_bytes() const noexcept { return idle_limit_.max(); }
  [[nodiscard]] const rounding_policy& rounding() const noexcept { return settings_.rounding; }
  [[nodiscard]] segment_policy segments() const noexcept { return settings_.segments; }
  /// The plan key of a step: `explicit_key` when set, else the cache's own key when auto_plans
  /// is on, else empty (a plain step).
  [[nodiscard]] std::string_view step_plan_key(std::string_view explicit_key) const noexcept;
  /// REFPOOL_NO_CACHING=1 was set when the cache was made: every request goes to the backend.
  [[nodiscard]] bool bypassed() const noexcept { return settings_.bypass; }

  // ---- for planned runs and uncached requests -----------------------------------------------
  /// A block straight from `backend`, owned by no cache (freed on its last release). On
  /// out-of-memory this cache's idle blocks of that backend are reclaimed and the request
  /// retried once, as for cached requests. Counted as an uncached allocation of this cache (by the
  /// whole-block source, whole_block_source::make_uncached); it holds a reference to the cache.
  block* allocate_uncached(backend_state& backend, std::size_t bytes, stream_ref stream);
  /// The out-of-memory step of the ladder, for memory the cache does not hand out itself (plan
  /// arenas, and the miss path itself): frees every idle block of `backend` (counted as
  /// reclaimed), trims its segment heaps, and counts a retry. Returns the bytes freed.
  std::size_t reclaim_for_retry(backend_state& backend);
  /// The out-of-memory ladder that whole blocks and plan arenas share: `attempt()` (a pointer or
  /// a bool; null or false: out of memory), and when it fails, reclaim_for_retry(backend) and one
  /// more attempt, whose result is returned. `freed`: the bytes the reclaim gave back.
  template <class Attempt>
  auto retry_once(backend_state& backend, std::size_t& freed, Attempt attempt) {
    auto got = attempt();
    if (got) return got;
    freed = reclaim_for_retry(backend);
    return attempt();
  }
  /// The same without counting a retry: before a plan arena is made or grown, so that the arena
  /// takes the place of the idle memory the plain path held for the same requests.
  std::size_t reclaim_idle(backend_state& backend);
  /// Every idle block of `backend` leaves the cache (pieces back to their heap, whole blocks to
  /// the backend) without a trim: before a yielded span is held again, so that it finds its home
  /// free, and the heap's committed bytes stay for it. Counted as reclaimed. Returns the bytes.
  std::size_t return_idle(backend_state& backend) noexcept;
  /// An uncached block of this cache lost its last handle: freed and uncounted by the whole-block
  /// source, then the cache's reference dropped.
  void free_uncached(block* b, bool via_unsafe_free) noexcept;
  /// Counts escapes and unsafe frees that a planned run saw (regions and uncached blocks).
  void add_escapes(std::size_t count) noexcept { counters_.extra_escapes.fetch_add(count, std::memory_order_relaxed); }
  void add_unsafe_free() noexcept { counters_.extra_unsafe_frees.fetch_add(1, std::memory_order_relaxed); }
  /// The extension attached under `tag` (one per part, e.g. plans), made by `make` if absent.
  cache_extension& extension(std::unique_ptr<cache_extension> (*make)(cache_state&));

  /// The segment heaps' spans (plan arenas: segment_source.hpp, "spans").
  [[nodiscard]] segment_source& spans() noexcept { return segment_pieces_; }
  /// Bytes held from backends, every kind, with their exact peak. The plans' arena source counts
  /// arenas here too (it retains it: the store goes after the cache dropped its reference).
  [[nodiscard]] reserved_counter& reserved() const noexcept { return *reserved_; }

  // ---- for block sources (block_source.hpp) ------------------------------------------------------
  /// A miss's new block `b` over `ptr` joins `s`: its fields set, homed in its key's bucket, live,
  /// and counted as one of the slot's references (also if the cache closed meanwhile). `waited`:
  /// it waits for other streams (a cross-stream reuse). Throws std::bad_alloc, nothing homed.
  void home_new_block(slot& s, backend_state& backend, const block_key& key, block* b, void* ptr, stream_ref stream,
                      bool waited);
  /// A block joined the cache: held_bytes and its peak.
  void count_held(std::size_t bytes) noexcept { counters_.count_held(bytes); }
  /// A request failed after the retry: counted in ooms.
  void count_oom() noexcept { counters_.ooms.fetch_add(1, std::memory_order_relaxed); }
  /// Gives every idle piece of `h` in the pool of `bytes` back to the heap (this slot's, then
  /// other slots'), where they coalesce. Returns how many. Takes mutex_.
  std::size_t give_back_idle_pieces(slot& s, cache_heap& h, std::size_t bytes);

  /// For tests (defined in test/support/cache_check.cpp, not in the library): checks every segment heap
  /// (segment_heap::check) and that the bytes of pieces the heaps have out equal the bytes of this cache's blocks that
  /// are pieces, live and idle. Throws std::logic_error naming the first violation.
  void check_segments() const;

  /// What the cache holds from its backends, segment by segment (memory_map.hpp,
  /// cache_memory_map.cpp: heaps' segments with live and idle pieces, free bytes and arenas; idle
  /// whole blocks; not live whole blocks). Thread-safe (mutex_, slots as an intruder, then each
  /// heap); a block handed out or taken back meanwhile may show in either state. Throws bad_alloc.
  [[nodiscard]] memory_map map_memory() const;

 private:
  friend class ref_counted<cache_state>;
  ~cache_state();

  // Hit-path helpers (caller holds s); mark_live is inline (hit_path.hpp).
  inline void mark_live(slot& s, bucket& home, block* b, bool hit) noexcept;
  bool put_back_in_slot(slot& s, block* b, bool via_unsafe_free) noexcept;  // true: over the idle limit
  bool drain_handed_off(slot& s) noexcept;                                  // true when over the idle limit afterwards
  bool drain_list(slot& s, block* newest) noexcept;
  bool add_idle(slot& s, block* b) noexcept;  // true when over the idle limit
  void remove_idle(slot& s, block* b) noexcept;
  void roll_epoch(slot& s, std::uint64_t epoch) noexcept;
  /// An ambient slot still in an ended step's epoch rolls to the current one (counting the step's
  /// escapes): steps end without touching the slots, each slot catches up when next held.
  void catch_up_with_steps(slot& s) noexcept {
    if (!s.ambient) return;
    const std::uint64_t epoch = step_.epoch.load(std::memory_order_relaxed);
    if (epoch != s.epoch) [[unlikely]]
      roll_epoch(s, epoch);
  }

  // Slow paths.
  router_ref retain_step_router() const noexcept;
  /// step_router() when the calling thread keeps no router of step `epoch` of this cache: takes a
  /// counted one, and keeps it when that step is still open.
  router_ref thread_step_router(std::uint64_t epoch) noexcept;
  /// ambient_slot() when the thread's most recent lease is of another cache: finds or makes the
  /// thread's lease of this one (thread_holdings.cpp).
  slot* lease_ambient_for_thread();
  slot* lease_locked(std::vector<slot*>& free, const void* thread);
  bool intrude(slot& s) noexcept;  // caller holds mutex_; drains; true when over the idle limit after
  void intrude_all() noexcept;     // caller holds mutex_; every slot held and drained
  void leave_all() noexcept;
  block* steal(slot& thief, const block_key& key, stream_ref stream, bool& other_stream);
  block* allocate_new(slot& s, backend_state& backend, const block_key& key, std::size_t requested, stream_ref stream);

  // Idle blocks leaving the cache (reclaim_policy.hpp: least recently released first), out of
  // their slots under mutex_; pieces back to their heap before mutex_ is left (else a memory map
  // finds them in neither and calls them live), whole blocks to their backend with no lock held.
  struct taken_blocks {
    std::vector<block*> blocks;
    std::size_t bytes = 0;      ///< their capacities
    std::size_t idle_left = 0;  ///< idle bytes of matching blocks left in the cache
  };
  /// Takes them out and gives the pieces among them back to their heaps (`blocks` keeps the whole
  /// blocks, for free_blocks). Caller holds mutex_.
  taken_blocks take_idle_locked(std::size_t keep, const std::function<bool(const block_key&)>& filter,
                                std::atomic<std::uint64_t>& counter);
  void return_taken_pieces_locked(std::vector<block*>& blocks) noexcept;  // the pieces leave `blocks`
  std::size_t free_blocks(const std::vector<block*>& blocks) noexcept;    // bytes their sources freed to backends
  /// Frees idle blocks until at most `keep` idle bytes remain (idle blocks, then segment free
  /// bytes); returns the bytes given back to backends. Trims throw only what order_streams throws.
  std::size_t free_idle(std::size_t keep, std::atomic<std::uint64_t>& counter);
  /// Frees idle blocks (then segment free bytes) down to max_idle_bytes when idle bytes passed it.
  void enforce_idle_limit() noexcept;
  void free_to_backend(block* b) noexcept;  // to its source, uncounted from held bytes

  // Taking idle bytes back at their address (take_at.cpp).
  block* take_idle_block_at(slot& s, const block_key& key, std::uintptr_t address, stream_ref stream,
                            bool& other_stream);
  block* carve_idle_at(slot& s, backend_state& backend, const block_key& key, std::uintptr_t address, stream_ref stream,
                       std::string_view where);
  /// Gives the idle pieces that are the ranges `used` of `h` back to it; throws invalid_argument
  /// naming the first range that is no idle piece of this cache (live, or a span), nothing changed.
  void return_idle_pieces_over(cache_heap& h, const block_key& key, const std::vector<segment_heap::in_use>& used,
                               std::string_view where);

  // Block sources.
  /// Where `backend`'s new blocks come from in this cache, and where they go back to.
  block_source& source_for(const backend_state& backend) noexcept {
    if (piece_unit(backend, settings_.segments) != 1) return segment_pieces_;
    return whole_blocks_;
  }
  [[nodiscard]] std::array<block_source*, 2> sources() noexcept { return {&whole_blocks_, &segment_pieces_}; }
  [[nodiscard]] std::array<const block_source*, 2> sources() const noexcept {
    return {&whole_blocks_, &segment_pieces_};
  }

  // Idle pieces in slots (cache_segments.cpp).
  [[noreturn]] static void throw_piece_rounding_overflow(std::size_t bytes, std::size_t unit);
  void detach_idle(slot& s, const std::vector<block*>& pieces, std::size_t from) noexcept;  // caller holds s
  /// Gives detached idle pieces back to `h` (segment_source::return_pieces). Returns how many.
  std::size_t return_pieces(cache_heap& h, std::span<block* const> pieces) noexcept;
  void put_back_elsewhere(slot& s, block* b, bool via_unsafe_free) noexcept;
  void put_back_orphaned(slot& s, block* b) noexcept;
  /// Drops one of `s`'s references (slot::refs); the last deletes the slot. Not under mutex_.
  void drop_slot_ref(slot& s) noexcept;

  const cache_settings settings_;  // what the options fixed when the cache was made
  std::atomic<bool> closed_{false};

  mutable std::mutex mutex_;  // see the top of this file
  cache_slot_lists slots_;    // under mutex_
  std::unique_ptr<cache_extension> extension_;
  std::vector<block*> giving_back_;  // give_back_idle_pieces' list, under mutex_

  cache_step_state step_;

  // The idle limit and the idle bytes over all slots, counted only while a limit is set (so the
  // hit path of an unlimited cache touches no shared counter). Changes under a slot.
  idle_limit idle_limit_;

  std::atomic<std::uint64_t> next_block_id_{1};
  std::atomic<std::uint64_t> clock_{1};  // ticks at each scope exit: the LRU time base
  cache_counters counters_;              // the cache's own counters (cache_counters.hpp)
  // Everything held from backends (plain blocks, committed segments, arenas, uncached buffers),
  // counted by the block sources and arenas, never by the cache itself.
  reserved_counter* const reserved_;
  // The block sources (after reserved_: they count into it).
  whole_block_source whole_blocks_;
  segment_source segment_pieces_;
};

/// Room for one more block in `home`'s idle list, so putting it back never allocates.
inline void reserve_for_one_more(bucket& home) { home.idle.reserve(home.live + home.idle.size() + 1); }

/// A direct block's last handle went away: freed to its backend (and counted by the cache it was
/// made for, if any).
void free_direct(block* b, bool via_unsafe_free) noexcept;

}  // namespace refpool::detail
