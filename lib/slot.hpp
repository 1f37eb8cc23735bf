// A slot: the cache state one scope allocates from (leased for the scope's life), with its own
// lock, so threads with their own scopes share no lock on the hit path. Idle blocks stay in
// the slot that last handed them out; other scopes may steal them on a miss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "block.hpp"
#include "block_key.hpp"
#include "spinlock.hpp"

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
    return static_cast<T*>(::operator new((n * sizeof(T) + line - 1) / line * line, std::align_val_t{line}));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{line}); }
  friend bool operator==(const line_allocator&, const line_allocator&) { return true; }
};

/// Idle blocks of one key within one slot.
struct alignas(64) bucket {
  block_key key;
  std::shared_ptr<backend_state> backend_owner;  ///< keeps the backend alive for its blocks
  slot* owner = nullptr;
  /// Sorted by id, highest first, so back() is the oldest block: handing out the oldest makes
  /// a repeated request sequence get the same blocks each iteration.
  std::vector<block*, line_allocator<block*>> idle;

  /// Takes the oldest idle block last used on `stream`, else the oldest; null if none.
  block* take(stream_ref stream) noexcept;
  /// Puts an idle block back in order.
  void put(block* b);
  /// Removes `b` (known to be idle here).
  void remove(block* b) noexcept;
};

/// Plain counters, guarded by the slot's lock.
struct slot_counters {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t steals = 0;
  std::uint64_t unsafe_frees = 0;
  std::uint64_t escapes = 0;
  std::uint64_t cross_stream_reuses = 0;
  std::size_t live_blocks = 0;
  std::size_t idle_blocks = 0;
  std::size_t live_bytes = 0;
  std::size_t idle_bytes = 0;
};

struct alignas(64) slot {
  explicit slot(cache_state* c) : cache(c) {}

  spinlock lock;
  cache_state* const cache;
  key_map<bucket> buckets;
  bucket* last_bucket = nullptr;  ///< the most recent lookup: loops often repeat one size
  slot_counters counters;

  // Escape accounting: blocks handed out in the current epoch (scope lease) and still live.
  std::uint64_t epoch = 1;
  std::uint64_t live_in_epoch = 0;

  std::uint64_t releases = 0;  ///< idle_seq source

  bool leased = false;    ///< a scope allocates from it now
  bool orphaned = false;  ///< its cache was destroyed: delete when unleased and no live blocks
  std::thread::id last_thread;  ///< prefer giving the slot back to the thread that used it last

  /// The bucket for `key`, made if absent. Caller holds `lock`.
  bucket& bucket_for(const block_key& key, const std::shared_ptr<backend_state>& backend);
};

}  // namespace refpool::detail
