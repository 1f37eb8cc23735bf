// Buckets: each key's idle blocks in one slot, oldest handed out first.
#include "slot.hpp"

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

void bucket::put(block* b) {
  if (idle.empty() || newer(idle.back(), b)) {
    idle.push_back(b);  // the common case: b is the oldest
    return;
  }
  idle.insert(std::upper_bound(idle.begin(), idle.end(), b, newer), b);
}

void bucket::remove(block* b) noexcept {
  auto it = std::lower_bound(idle.begin(), idle.end(), b, newer);
  if (it != idle.end() && *it == b) idle.erase(it);
}

bucket& slot::bucket_for(const block_key& key, const std::shared_ptr<backend_state>& backend) {
  return buckets.find_or_insert(key, [&] {
    auto made = std::make_unique<bucket>();
    made->key = key;
    made->backend_owner = backend;
    made->owner = this;
    return made;
  });
}

}  // namespace refpool::detail
