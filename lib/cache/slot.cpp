// Buckets: each key's idle blocks in one slot, oldest handed out first.
#include "cache/slot.hpp"

#include <algorithm>

#include "cache/cache_state.hpp"
#include "segments/segment_heap.hpp"

namespace refpool::detail {

namespace {
bool newer(const block* a, const block* b) noexcept { return a->id > b->id; }
}  // namespace

block* bucket::take(stream_ref stream) noexcept {
  if (idle.empty()) return nullptr;
  if (idle.back()->last_stream == stream) return pop_oldest();  // the common case: one stream
  // Oldest block of the requesting stream first: same-stream reuse needs no synchronisation.
  for (auto it = idle.rbegin() + 1; it != idle.rend(); ++it) {
    if ((*it)->last_stream == stream) {
      block* b = *it;
      idle.erase(std::next(it).base());
      if (pieces != nullptr) pieces->unlink(b);
      return b;
    }
  }
  return pop_oldest();
}

void bucket::insert_in_order(block* b) noexcept {
  idle.insert(std::upper_bound(idle.begin(), idle.end(), b, newer), b);
}

void bucket::remove(block* b) noexcept {
  auto it = std::lower_bound(idle.begin(), idle.end(), b, newer);
  if (it != idle.end() && *it == b) {
    idle.erase(it);
    if (pieces != nullptr) pieces->unlink(b);
  }
}

piece_list* slot::pieces_for(const block_key& key) {
  if (piece_unit(*key.backend, cache->segments()) == 1) return nullptr;  // plain blocks
  const bool small = key.bytes <= segment_heap_options{}.small_max;     // the cache's heaps use the defaults
  if (piece_list* found = find_pieces(key.backend, small)) return found;
  piece_lists.reserve(piece_lists.size() + 1);
  auto made = std::make_unique<piece_list>();
  made->backend = key.backend;
  made->small = small;
  piece_lists.push_back(std::move(made));
  return piece_lists.back().get();
}

void slot::erase_if_unused(bucket& b) noexcept {
  if (!b.unused()) return;
  if (last_bucket == &b) last_bucket = nullptr;
  const block_key key = b.key;  // b leaves the map in extract
  std::unique_ptr<bucket> erased = buckets.extract(key);
  if (spare_buckets.size() < spare_bucket_count) {
    try {
      spare_buckets.reserve(spare_bucket_count);
    } catch (...) {
      return;  // no room to keep it: freed
    }
    erased->live = 0;
    erased->pieces = nullptr;
    spare_buckets.push_back(std::move(erased));
  }
}

}  // namespace refpool::detail
