// A block: one backend allocation, as the cache and data_refs see it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <refpool/detail/block_header.hpp>
#include <refpool/types.hpp>

#include "backend_state.hpp"
#include "spinlock.hpp"

namespace refpool::detail {

struct bucket;
class plan;
class plan_run;

// Cache-line aligned: blocks of different threads must not share a line (false sharing).
struct alignas(64) block : block_header {
  void* ptr = nullptr;
  std::size_t capacity = 0;   ///< bytes allocated from the backend (rounded)
  std::size_t requested = 0;  ///< bytes of the current request (<= capacity)
  backend_state* backend = nullptr;
  /// Owning reference for blocks no cache owns (a cached block's bucket keeps its backend alive).
  std::shared_ptr<backend_state> direct_backend;
  /// The bucket of the scope state that handed the block out, or null: freed on last release.
  /// Changes only while the block is idle, under the cache's mutex.
  bucket* home = nullptr;
  stream_ref last_stream;
  std::uint64_t id = 0;          ///< creation number in its cache: lower ids are handed out first
  std::uint64_t epoch = 0;       ///< home scope state's epoch when handed out (escape counting)
  std::uint64_t idle_since = 0;  ///< cache clock when it went idle (least recently used first)
  std::uint64_t idle_seq = 0;    ///< its slot's release count then: orders releases within a tick
  bool idle = false;

  // Planned scopes. A region of a plan's arena has region_of set (and no home); any block handed
  // out in a planned scope has `run` set until its last handle goes, so the run learns lifetimes.
  plan* region_of = nullptr;
  std::uint32_t plan_index = 0;
  plan_run* run = nullptr;
  std::uint32_t run_index = 0;

  /// Streams added by record_stream, waited for at cross-stream reuse. Rarely used.
  spinlock streams_lock;
  std::vector<stream_ref> extra_streams;
};

inline block* as_block(block_header* h) noexcept { return static_cast<block*>(h); }

}  // namespace refpool::detail
