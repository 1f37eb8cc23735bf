// One cache's segment heap for one backend (docs/design.md, "Segments"): the heap, the lock
// that guards it, and the count of threads using it outside the cache's mutex.
//
// Locks. `mutex` guards `heap`. It is never taken while holding a slot's lock, and a thread
// holding it never takes the cache's mutex (where both are held, the cache's mutex comes
// first). The heap calls its backend (growth, trim) under `mutex`, never under the cache's.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <new>
#include <vector>

#include "access.hpp"
#include "backend_state.hpp"
#include "cache/piece_block.hpp"
#include "segments/segment_heap.hpp"

namespace refpool::detail {

struct cache_heap {
  // A heap of pieces has the default options: slot::pieces_for sorts idle pieces into pools by the
  // default small_max, so options set here must reach it too. A heap of spans alone (a backend the
  // cache keeps plain blocks for) has its own (segment_source::heap_options): it has no pieces.
  explicit cache_heap(backend_state& b, const segment_heap_options& options = {})
      : backend(&b), heap(handle_of(b), options) {
    spare_blocks.reserve(spare_block_count);
  }
  ~cache_heap() {
    for (piece_block* b : spare_blocks) delete b;
  }
  cache_heap(const cache_heap&) = delete;
  cache_heap& operator=(const cache_heap&) = delete;

  backend_state* const backend;  ///< its backend (the heap holds the counted reference)
  std::mutex mutex;
  segment_heap heap;
  /// Threads that found this heap under the cache's mutex and use it after leaving that mutex
  /// (a miss carving from it, a reclaim trimming it). Raised only under the cache's mutex; a
  /// heap is destroyed before its cache only under that mutex, while this is 0 and the heap
  /// holds no segment (so no block is a piece of it).
  std::atomic<std::size_t> users{0};

  /// Block records of pieces given back, kept for the next pieces (under `mutex`): a miss then
  /// allocates no record. 64: more than the pieces one miss usually gives back.
  static constexpr std::size_t spare_block_count = 64;
  std::vector<piece_block*> spare_blocks;

  /// A fresh block record: a spare one, or a new one (std::bad_alloc).
  piece_block* new_block() {
    {
      std::lock_guard lock(mutex);
      if (!spare_blocks.empty()) {
        piece_block* b = spare_blocks.back();
        spare_blocks.pop_back();
        return b;
      }
    }
    return new piece_block;
  }
  /// Keeps `b` (no longer used) as a spare, or deletes it. Caller holds `mutex`.
  void retire_block(piece_block* b) noexcept {
    if (spare_blocks.size() < spare_block_count) {
      b->~piece_block();
      new (b) piece_block;
      spare_blocks.push_back(b);  // within the reserved capacity
    } else {
      delete b;
    }
  }

 private:
  static refpool::backend handle_of(backend_state& b) noexcept {
    b.retain();
    return access::adopt(&b);
  }
};

/// Holds one use of a heap (see cache_heap::users) until it goes out of scope.
class heap_use {
 public:
  explicit heap_use(cache_heap& h) noexcept : heap_(&h) {}  // the caller raised users
  heap_use(heap_use&& other) noexcept : heap_(other.heap_) { other.heap_ = nullptr; }
  heap_use(const heap_use&) = delete;
  heap_use& operator=(const heap_use&) = delete;
  heap_use& operator=(heap_use&&) = delete;
  ~heap_use() {
    if (heap_ != nullptr) heap_->users.fetch_sub(1, std::memory_order_acq_rel);
  }
  cache_heap& operator*() const noexcept { return *heap_; }
  cache_heap* operator->() const noexcept { return heap_; }

 private:
  cache_heap* heap_;
};

/// Every stream that may still use idle block `b`: its last stream and any recorded ones.
inline stream_set streams_of(block& b) noexcept {
  stream_set out(b.last_stream);
  std::lock_guard guard(b.streams_lock);
  for (stream_ref s : b.extra_streams) out.add(s);
  return out;
}

}  // namespace refpool::detail
