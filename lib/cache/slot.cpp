// Buckets: each key's idle blocks in one slot, oldest handed out first.
#include "cache/slot.hpp"

#include <algorithm>

namespace refpool::detail {

namespace {
bool newer(const block* a, const block* b) noexcept { return a->id > b->id; }
}  // namespace

block* bucket::take(stream_ref stream) noexcept {
  if (idle.empty()) return nullptr;
  block* oldest = idle.back();
  if (oldest->last_stream == stream) {  // the common case: one stream
    idle.pop_back();
    return oldest;
  }
  // Oldest block of the requesting stream first: same-stream reuse needs no synchronisation.
  for (auto it = idle.rbegin() + 1; it != idle.rend(); ++it) {
    if ((*it)->last_stream == stream) {
      block* b = *it;
      idle.erase(std::next(it).base());
      return b;
    }
  }
  idle.pop_back();
  return oldest;
}

void bucket::insert_in_order(block* b) noexcept { idle.insert(std::upper_bound(idle.begin(), idle.end(), b, newer), b); }

void bucket::remove(block* b) noexcept {
  auto it = std::lower_bound(idle.begin(), idle.end(), b, newer);
  if (it != idle.end() && *it == b) idle.erase(it);
}

void slot::erase_if_unused(bucket& b) noexcept {
  if (!b.unused()) return;
  if (last_bucket == &b) last_bucket = nullptr;
  const block_key key = b.key;  // b dies in erase
  buckets.erase(key);
}

}  // namespace refpool::detail
