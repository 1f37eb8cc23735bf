// segment_heap trim: whole free segments go back to the backend (deallocated, or decommitted
// and released), then free tails of virtual-memory segments are decommitted commit by commit.
#include <fmt/format.h>

#include <refpool/error.hpp>

#include "access.hpp"
#include "cache/backend_state.hpp"
#include "poison.hpp"
#include "segment_heap.hpp"

namespace refpool::detail {

std::size_t segment_heap::trim(std::size_t keep_bytes) {
  std::size_t given = 0;
  while (committed_ - used_ > keep_bytes) {
    segment* whole = nullptr;
    segment* tail = nullptr;
    for (const auto& seg : segments_) {
      if (seg->pieces == 0) {
        if (whole == nullptr || seg->last_use < whole->last_use) whole = seg.get();
      } else if (seg->virtual_memory && seg->last->free && seg->commit_ends.size() > 1) {
        // Only a commit the free tail covers entirely can go.
        const std::size_t last_commit_start = seg->commit_ends[seg->commit_ends.size() - 2];
        if (seg->last->address <= seg->base + last_commit_start && (tail == nullptr || seg->last_use < tail->last_use))
          tail = seg.get();
      }
    }
    if (whole != nullptr)
      given += release_segment(*whole);
    else if (tail != nullptr)
      given += decommit_last_commit(*tail);
    else
      break;
  }
  return given;
}

void segment_heap::release_all() {
  if (pieces_out_ != 0)
    throw invalid_argument(fmt::format("refpool: cannot release the segments of {}: {} pieces ({} B) are still out",
                            backend_.name(), pieces_out_, used_));
  while (!segments_.empty()) release_segment(*segments_.back());
}

std::size_t segment_heap::release_segment(segment& seg) {
  range* r = seg.first;  // the only range: the segment has no piece, and free neighbours merge
  stream_ref last_stream{};
  if (!seg.virtual_memory && !r->streams.any() && !r->streams.empty()) {
    // A stream-ordered free runs on one stream; make it wait for the others first.
    last_stream = *r->streams.begin();
    for (const stream_ref s : r->streams)
      if (!(s == last_stream)) backend_.underlying().order_streams(s, last_stream);
  }
  const std::size_t bytes = seg.committed;
  pools_[static_cast<std::size_t>(seg.pool)].free.erase(r);
  if (host_visible_) unpoison_bytes(seg.base, bytes);  // the backend (or a later mapping) reuses them
  if (seg.virtual_memory) {
    // Decommit commit by commit: each was one physical allocation, and a GPU unmaps whole ones.
    std::size_t end = seg.committed;
    for (std::size_t i = seg.commit_ends.size(); i-- > 0;) {
      const std::size_t start = i == 0 ? 0 : seg.commit_ends[i - 1];
      vm_->decommit(reinterpret_cast<void*>(seg.base + start), end - start);
      end = start;
      ++counts_.decommits;
    }
    vm_->release(reinterpret_cast<void*>(seg.base), seg.reserved);
    physical_ -= seg.commit_ends.size();
    access::state(backend_)->outstanding_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  } else {
    access::state(backend_)->deallocate(reinterpret_cast<void*>(seg.base), seg.reserved, last_stream);
    --physical_;
  }
  committed_ -= bytes;
  reserved_ -= seg.reserved;
  counts_.trimmed_bytes += bytes;
  ++counts_.segments_released;
  drop_segment(seg);
  return bytes;
}

std::size_t segment_heap::decommit_last_commit(segment& seg) noexcept {
  range* last = seg.last;
  const std::size_t start = seg.commit_ends[seg.commit_ends.size() - 2];
  const std::size_t bytes = seg.committed - start;
  free_index& index = pools_[static_cast<std::size_t>(seg.pool)].free;
  index.erase(last);
  if (host_visible_) unpoison_bytes(seg.base + start, bytes);
  vm_->decommit(reinterpret_cast<void*>(seg.base + start), bytes);
  seg.committed = start;
  seg.commit_ends.pop_back();
  committed_ -= bytes;
  --physical_;
  ++counts_.decommits;
  counts_.trimmed_bytes += bytes;
  access::state(backend_)->outstanding_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  last->bytes -= bytes;
  if (last->bytes != 0) {
    index.insert(last);
  } else {  // the free tail was exactly the commit; a piece ends the segment now
    seg.last = last->prev;
    seg.last->next = nullptr;
    delete last;
  }
  return bytes;
}

void segment_heap::drop_segment(segment& seg) noexcept {
  for (range* r = seg.first; r != nullptr;) {
    range* next = r->next;
    delete r;
    r = next;
  }
  pool_state& pool = pools_[static_cast<std::size_t>(seg.pool)];
  if (pool.growable == &seg) pool.growable = nullptr;
  for (auto it = segments_.begin(); it != segments_.end(); ++it)
    if (it->get() == &seg) {
      segments_.erase(it);
      break;
    }
}

}  // namespace refpool::detail
