// A block: one buffer as the cache and data_refs see it (a backend allocation, a piece of a
// segment: piece_block.hpp, or a region of a plan's arena: region_block.hpp). It holds what every
// block has. Each block has exactly one owner, named by its origin, and the release path is one
// switch on that origin (api/allocate.cpp). Glossary: docs/design.md.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <refpool/detail/block_header.hpp>
#include <refpool/types.hpp>

#include "backend_state.hpp"
#include "cache/spinlock.hpp"

namespace refpool::detail {

struct block;
class block_source;
struct bucket;
class cache_state;
struct pointer_node;

/// Takes `b`'s node out of the pointer table (if it still has one). Called by ~block: nobody
/// holds `b` (pointer_table.cpp).
void forget_pointer(block& b) noexcept;

/// Who takes a block back when its last handle goes.
enum class block_origin : std::uint8_t {
  direct,  ///< straight from the backend, owned by no cache: freed on its last release
  cached,  ///< handed out by a cache: goes back to its home bucket, idle
  region,  ///< a region of a plan's arena (region_block.hpp): goes back to its region_owner
};

/// Told of every release of a block it asked to observe, before the block goes to its owner
/// (a planned run learning lifetimes). The one hook through which plans see the core.
class release_observer {
 public:
  virtual void observe_release(block* b, bool via_unsafe_free) noexcept = 0;

 protected:
  ~release_observer() = default;
};

/// When a cached block last went idle: reclaim takes idle blocks least recently released first
/// (reclaim_policy.hpp), ordered by tick, then by seq within a tick.
struct block_idle_stamp {
  std::uint64_t tick = 0;  ///< the cache clock then
  std::uint64_t seq = 0;   ///< its slot's release count then
};

/// A block released on another thread than its slot's waits in the slot's hand-off list
/// (slot::handed_off) until the slot's owner, or a thread holding the slot, drains it.
struct block_hand_off {
  block* next = nullptr;  ///< the next block of the list
  bool unsafe = false;    ///< the release was an unsafe_free
  bool in_epoch = false;  ///< the step it was handed out in was still open
};

// Cache-line aligned: blocks of different threads must not share a line (false sharing).
struct alignas(64) block : block_header {
  /// The backend the memory came from. Direct and cached blocks hold one counted reference to
  /// it (so idle blocks keep their backend alive until freed); regions rely on their arena's.
  backend_state* backend = nullptr;
  block_origin origin = block_origin::direct;
  bool idle = false;  ///< cached blocks: in an idle list now
  union {
    bucket* home;               ///< cached: the bucket it returns to (changes only while idle)
    cache_state* uncached_for;  ///< direct: the cache whose scope asked for it, or null (counting)
  };
  release_observer* observer = nullptr;  ///< planned runs: sees the release first
  std::uint32_t observer_index = 0;      ///< the observer's number for this block
  stream_ref last_stream;
  std::uint64_t id = 0;      ///< cached: creation number; lower ids are handed out first
  std::uint64_t epoch = 0;   ///< cached: its slot's epoch when handed out (escape counting)
  block_idle_stamp idle_at;  ///< cached: when it last went idle
  block_hand_off hand_off;   ///< its place in a slot's hand-off list (released on another thread)

  /// Streams added by record_stream, waited for at cross-stream reuse. Rarely used.
  spinlock streams_lock;
  std::vector<stream_ref> extra_streams;

  /// Cached blocks: the block source its memory came from and goes back to (block_source.hpp).
  /// What only one source's blocks need lives with that source (piece_block.hpp).
  block_source* source = nullptr;

  /// Its node in the pointer table, made by its first to_pointer; null before (pointer_table.cpp).
  std::atomic<pointer_node*> pointer{nullptr};

  block() noexcept : home(nullptr) {}
  ~block() {
    // Acquire: a null here may be another block's node_of taking the node (a region of another
    // plan over the same bytes), which wrote this field; the block's memory goes after that write.
    if (pointer.load(std::memory_order_acquire) != nullptr) forget_pointer(*this);
  }
  block(const block&) = delete;
  block& operator=(const block&) = delete;
};

inline block* as_block(block_header* h) noexcept { return static_cast<block*>(h); }
inline const block* as_block(const block_header* h) noexcept { return static_cast<const block*>(h); }

}  // namespace refpool::detail
