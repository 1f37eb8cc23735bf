// The reclaim policy of a cache: which idle blocks leave first when idle memory must go (reclaim,
// the idle limit, the out-of-memory retry), and how much of `keep` is left to the memory the block
// sources keep outside blocks. Least recently released first: by the scope-exit clock at release
// (block::idle_at.tick), then by release order within a slot (block::idle_at.seq); blocks leave until at
// most `keep` bytes of the offered ones stay idle. The rest (taking blocks out of their slots under
// the cache's mutex, giving them to their sources) is the cache's, in cache_reclaim.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache/block.hpp"

namespace refpool::detail {

struct slot;

class lru_reclaim {
 public:
  /// Idle block `b` of slot `s` may leave. Throws std::bad_alloc.
  void offer(block* b, slot* s) {
    candidates_.push_back({b->idle_at, b, s});
    offered_bytes_ += b->capacity;
  }
  [[nodiscard]] std::size_t offered_bytes() const noexcept { return offered_bytes_; }
  [[nodiscard]] std::size_t offered() const noexcept { return candidates_.size(); }

  /// Calls `leave(b, s)` for the offered blocks that leave, least recently released first, until
  /// at most `keep` offered bytes stay. Returns the bytes that left.
  template <class Leave>
  std::size_t choose(std::size_t keep, Leave&& leave) {
    std::sort(candidates_.begin(), candidates_.end(), [](const candidate& x, const candidate& y) {
      return x.at.tick != y.at.tick ? x.at.tick < y.at.tick : x.at.seq < y.at.seq;
    });
    std::size_t left = 0;
    for (const candidate& c : candidates_) {
      if (offered_bytes_ - left <= keep) break;
      left += c.b->capacity;
      leave(c.b, c.s);
    }
    return left;
  }

  /// What the sources may keep of their free memory once `idle_left` idle bytes stayed in blocks:
  /// free memory outside blocks is idle memory too, and gets what `keep` leaves.
  [[nodiscard]] static std::size_t source_keep(std::size_t keep, std::size_t idle_left) noexcept {
    return keep > idle_left ? keep - idle_left : 0;
  }

 private:
  struct candidate {
    block_idle_stamp at;
    block* b;
    slot* s;
  };
  std::vector<candidate> candidates_;
  std::size_t offered_bytes_ = 0;
};

}  // namespace refpool::detail
