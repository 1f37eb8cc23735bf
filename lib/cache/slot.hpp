// A slot: the cache state one scope (or one thread's cache-level allocations) allocates from,
// owned by that thread while leased. Its owner enters it with plain stores (owner_lock); other
// threads' releases reach it through a lock-free hand-off list; steals, reclaim and stats
// intrude through the owner_lock's slow side. Idle blocks stay in the slot that last handed
// them out; other scopes may steal them on a miss.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "cache/block.hpp"
#include "cache/block_key.hpp"
#include "cache/owner_lock.hpp"
#include "cache/piece_block.hpp"
#include "cache/scope_frame.hpp"

namespace refpool::detail {

class cache_state;
struct slot;

/// An allocator of whole cache lines, so the idle lists of different threads never share one.
template <class T>
struct line_allocator {
  using value_type = T;
  static constexpr std::size_t line = 64;
  line_allocator() = default;
  template <class U>
  line_allocator(const line_allocator<U>&) noexcept {}  // NOLINT: rebinding is implicit
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new ((n * sizeof(T) + line - 1) / line * line, std::align_val_t{line}));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete (p, std::align_val_t{line}); }
  friend bool operator==(const line_allocator&, const line_allocator&) { return true; }
};

/// The idle pieces of one backend's segment pool (small or large) within one slot, linked
/// through their blocks, so that a miss giving idle pieces back to the heap finds them without
/// scanning every bucket (a bucket per size: thousands under random sizes). Its buckets keep it.
struct piece_list {
  const backend_state* backend = nullptr;
  bool small = false;
  piece_block* first = nullptr;
  std::size_t count = 0;

  /// Links `idle`, a piece (the buckets that have a piece list hold only pieces).
  void link(block* idle) noexcept {
    piece_block* b = as_piece(idle);
    b->idle_piece_prev = nullptr;
    b->idle_piece_next = first;
    if (first != nullptr) first->idle_piece_prev = b;
    first = b;
    ++count;
  }
  void unlink(block* idle) noexcept {
    piece_block* b = as_piece(idle);
    (b->idle_piece_prev != nullptr ? b->idle_piece_prev->idle_piece_next : first) = b->idle_piece_next;
    if (b->idle_piece_next != nullptr) b->idle_piece_next->idle_piece_prev = b->idle_piece_prev;
    b->idle_piece_prev = b->idle_piece_next = nullptr;
    --count;
  }
};

/// The blocks of one key within one slot: idle ones in a list, live ones counted. A bucket with
/// neither is erased (on the slow paths that empty it), so bookkeeping does not grow with every
/// size ever seen, and no bucket keeps a backend alive (blocks do).
struct alignas(64) bucket {
  block_key key;
  slot* owner = nullptr;
  std::size_t live = 0;  ///< blocks of this bucket held by handles (their home is this bucket)
  /// Where its idle blocks are also listed when they are pieces of a segment heap; else null.
  piece_list* pieces = nullptr;
  /// Sorted by id, highest first, so back() is the oldest block: handing out the oldest makes
  /// a repeated request sequence get the same blocks each iteration.
  std::vector<block*, line_allocator<block*>> idle;

  /// Takes the oldest idle block last used on `stream`, else the oldest; null if none.
  block* take(stream_ref stream) noexcept;
  /// Puts an idle block back in order (capacity is reserved: never reallocates).
  void put(block* b) noexcept {
    if (idle.empty() || idle.back()->id > b->id) [[likely]] {
      idle.push_back(b);  // the common case: b is the oldest
    } else {
      insert_in_order(b);
    }
    if (pieces != nullptr) pieces->link(b);
  }
  /// Takes the oldest idle block (the bucket has one).
  block* pop_oldest() noexcept {
    block* b = idle.back();
    idle.pop_back();
    if (pieces != nullptr) pieces->unlink(b);
    return b;
  }
  /// Empties the idle list (the cache is closing: the blocks are freed).
  void clear_idle() noexcept {
    if (pieces != nullptr)
      for (block* b : idle) pieces->unlink(b);
    idle.clear();
  }
  void insert_in_order(block* b) noexcept;
  /// Removes `b` (known to be idle here).
  void remove(block* b) noexcept;
  [[nodiscard]] bool unused() const noexcept { return live == 0 && idle.empty(); }
};

/// Event counters of one slot, written by whoever holds it (owner or intruder), read by stats.
struct slot_counters {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t steals = 0;
  std::uint64_t unsafe_frees = 0;
  std::uint64_t escapes = 0;
  std::uint64_t cross_stream_reuses = 0;
  std::size_t live_bytes = 0;
  std::size_t peak_live_bytes = 0;
};

/// A block's epoch once its release was counted against its epoch (no slot has this epoch).
inline constexpr std::uint64_t no_epoch = ~std::uint64_t{0};

/// What `handed_off` holds after the cache was destroyed: releases then free their block.
inline block* const orphaned_marker = reinterpret_cast<block*>(alignof(block));

struct alignas(64) slot {
  explicit slot(cache_state* c) : cache(c) {}

  owner_lock lock;
  cache_state* const cache;
  /// The leasing thread's token (this_thread_token()), or null while not leased. Changes only
  /// under the cache's mutex.
  std::atomic<const void*> owner_thread{nullptr};
  /// Blocks released on other threads, newest first (a Treiber stack), each with its
  /// unsafe_free flag in `hand_off.unsafe`; or orphaned_marker.
  std::atomic<block*> handed_off{nullptr};

  key_map<bucket> buckets;
  /// Buckets erased when they emptied, kept for the next new keys (a miss under irregular sizes
  /// empties one bucket and makes another), up to spare_bucket_count.
  static constexpr std::size_t spare_bucket_count = 32;
  std::vector<std::unique_ptr<bucket>> spare_buckets;
  /// Idle pieces by backend and pool; few entries (one or two per backend with segments).
  std::vector<std::unique_ptr<piece_list>> piece_lists;
  bucket* last_bucket = nullptr;  ///< the most recent lookup: loops often repeat one size
  slot_counters counters;

  // Escape accounting: blocks handed out in the current epoch (a scope lease, or a step for
  // cache-level allocations) and still live.
  std::uint64_t epoch = 1;
  std::uint64_t live_in_epoch = 0;
  std::uint64_t releases = 0;  ///< block::idle_at.seq source

  bool ambient = false;               ///< serves a thread's cache-level allocations (not a scope)
  const void* last_thread = nullptr;  ///< prefer giving the slot back to the thread that used it last

  /// What keeps the slot (docs/design.md, "Lifetimes"): one reference for its cache while the
  /// cache is open, one for its lease while leased, and one per block homed here (live, idle or
  /// on the hand-off list). Counted as homes change (misses, steals, frees: never on the hit
  /// path), so the count is right at any moment; whoever drops the last one, which is possible
  /// only after the cache closed, deletes the slot (cache_state::drop_slot_ref).
  std::atomic<std::size_t> refs{1};

  /// The bucket for `key`, made if absent. Caller holds the slot.
  bucket& bucket_for(const block_key& key) {
    if (last_bucket == nullptr || !(last_bucket->key == key)) last_bucket = &find_or_make(key);
    // A bucket left empty holds no backend, so its key's backend may since have been destroyed and
    // another made at the same address: an empty bucket takes its piece list anew.
    if (last_bucket->unused()) last_bucket->pieces = pieces_for(key);
    return *last_bucket;
  }
  /// The bucket for `key` in the map, made (from a spare if any) if absent.
  bucket& find_or_make(const block_key& key) {
    return buckets.find_or_insert(key, [&] {
      std::unique_ptr<bucket> made;
      if (spare_buckets.empty()) {
        made = std::make_unique<bucket>();
      } else {  // its idle list keeps its capacity: no allocation
        made = std::move(spare_buckets.back());
        spare_buckets.pop_back();
      }
      made->key = key;
      made->owner = this;
      return made;
    });
  }
  /// The piece list blocks of `key` join when idle; null when the cache gives that key plain
  /// blocks. Made if absent. Caller holds the slot.
  piece_list* pieces_for(const block_key& key);
  /// The list of `backend`'s idle pieces of one pool, or null if none was made.
  [[nodiscard]] piece_list* find_pieces(const backend_state* backend, bool small) const noexcept {
    for (const auto& l : piece_lists)
      if (l->backend == backend && l->small == small) return l.get();
    return nullptr;
  }
  /// Erases `b` if no block is in it or homed in it. Caller holds the slot.
  void erase_if_unused(bucket& b) noexcept;
};

/// A token unique to the calling thread while it runs (the address of a thread-local): no call,
/// no load.
inline const void* this_thread_token() noexcept { return &current_frame; }

}  // namespace refpool::detail
