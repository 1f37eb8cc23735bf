// Taking idle bytes back at their address (cache_state::take_at): a private pool restored to a
// checkpoint (PyTorch's setCheckpointPoolState) hands out again, at their old addresses, buffers
// freed into it since. An idle block of the request's key at the address is handed out as a hit
// hands one out; with segments, the idle pieces over the bytes go back to their heap, and a piece
// is carved exactly there from free bytes, as a miss makes one. Rare, and on neither the hit nor
// the miss path. Locks (cache_state.hpp): mutex_, then the slots; a heap's lock after mutex_ or
// alone, never under a slot's.
#include <algorithm>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "cache/hit_path.hpp"  // mark_live, wait_for_streams

namespace refpool::detail {

namespace {

std::string byte_range(std::uintptr_t address, std::size_t bytes) {
  return fmt::format("[{:#x}, {:#x})", address, address + bytes);
}

std::uintptr_t address_of(const block* b) noexcept { return reinterpret_cast<std::uintptr_t>(b->ptr); }

}  // namespace

block* cache_state::take_at(slot& s, backend_state& backend, const block_key& key, std::uintptr_t address,
                            stream_ref stream, std::string_view where) {
  bool other_stream = false;
  block* b = take_idle_block_at(s, key, address, stream, other_stream);
  if (b == nullptr) {
    if (&source_for(backend) != &segment_pieces_) return nullptr;  // whole blocks: only an idle one of the key
    return carve_idle_at(s, backend, key, address, stream, where);
  }
  if (other_stream) {
    try {
      wait_for_streams(b, stream);  // as a reuse on another stream waits
    } catch (...) {
      put_back_cached(b, false);  // idle again, still ordered after its old streams
      throw;
    }
  }
  b->last_stream = stream;
  return b;
}

block* cache_state::take_idle_block_at(slot& s, const block_key& key, std::uintptr_t address, stream_ref stream,
                                       bool& other_stream) {
  std::lock_guard guard(mutex_);  // no steal, reclaim or miss giving pieces back meanwhile
  {
    owner_section section(s.lock);
    reserve_for_one_more(s.bucket_for(key));  // may throw std::bad_alloc: nothing taken yet
  }
  intrude_all();  // every slot, ours too: the block may be idle in any of them
  block* b = nullptr;
  for (const auto& holder : slots_.all) {
    bucket* from = holder->buckets.find(key);
    if (from == nullptr) continue;
    const auto it =
        std::find_if(from->idle.begin(), from->idle.end(), [&](const block* i) { return address_of(i) == address; });
    if (it == from->idle.end()) continue;
    b = *it;
    from->remove(b);
    remove_idle(*holder, b);
    if (holder.get() != &s) {  // its home moves to `s`, as a steal moves it
      holder->erase_if_unused(*from);
      holder->refs.fetch_sub(1, std::memory_order_relaxed);  // never the last: the cache is open
      s.refs.fetch_add(1, std::memory_order_relaxed);
      s.counters.steals += 1;
    }
    break;
  }
  if (b != nullptr) {
    catch_up_with_steps(s);
    mark_live(s, s.bucket_for(key), b, true);  // the bucket exists: reserved above, under mutex_ since
    other_stream = b->last_stream != stream || !b->extra_streams.empty();
    if (other_stream) s.counters.cross_stream_reuses += 1;
  } else if (bucket* mine = s.buckets.find(key)) {
    s.erase_if_unused(*mine);  // the one made above, if it holds nothing
  }
  leave_all();
  return b;
}

block* cache_state::carve_idle_at(slot& s, backend_state& backend, const block_key& key, std::uintptr_t address,
                                  stream_ref stream, std::string_view where) {
  std::optional<heap_use> h = segment_pieces_.find_heap(backend);
  if (!h) return nullptr;  // no segment yet: nothing was handed out
  std::vector<segment_heap::in_use> used;
  {
    std::lock_guard lock((*h)->mutex);
    std::optional<std::vector<segment_heap::in_use>> over = (*h)->heap.in_use_over(address, key.bytes);
    if (!over) return nullptr;  // not bytes of its segments where a piece of the key could lie
    used = std::move(*over);
  }
  return_idle_pieces_over(**h, key, used, where);
  if (block* b = segment_pieces_.make_at(s, **h, key, address, stream)) return b;
  bool taken_meanwhile = true;  // by a request of another thread since they were checked, or out of memory
  {
    std::lock_guard lock((*h)->mutex);
    const std::optional<std::vector<segment_heap::in_use>> over = (*h)->heap.in_use_over(address, key.bytes);
    taken_meanwhile = !over || !over->empty();
  }
  if (!taken_meanwhile)
    throw out_of_memory(fmt::format("refpool: {}: out of memory committing the trimmed parts of bytes {}", where,
                                    byte_range(address, key.bytes)),
                        key.bytes, backend.device());
  throw invalid_argument(fmt::format("refpool: {}: bytes {} were handed out by another request meanwhile", where,
                                     byte_range(address, key.bytes)));
}

void cache_state::return_idle_pieces_over(cache_heap& h, const block_key& key,
                                          const std::vector<segment_heap::in_use>& used, std::string_view where) {
  if (used.empty()) return;
  std::lock_guard guard(mutex_);
  const bool small = h.heap.small(key.bytes);  // the heap's pool of the key: its idle pieces' list
  std::vector<block*> found(used.size(), nullptr);
  std::vector<slot*> holders(used.size(), nullptr);
  std::vector<block*> pieces;
  pieces.reserve(used.size());  // before any slot is held: nothing below allocates
  intrude_all();
  for (std::size_t i = 0; i < used.size() && !used[i].span; ++i) {
    for (const auto& holder : slots_.all) {
      const piece_list* list = holder->find_pieces(h.backend, small);
      for (piece_block* p = list != nullptr ? list->first : nullptr; p != nullptr; p = p->idle_piece_next) {
        if (p->piece.node == used[i].node && address_of(p) == used[i].address) {
          found[i] = p;
          holders[i] = holder.get();
        }
      }
    }
  }
  const auto missing = std::find(found.begin(), found.end(), nullptr);
  if (missing != found.end()) {
    leave_all();
    const segment_heap::in_use& u = used[static_cast<std::size_t>(missing - found.begin())];
    throw invalid_argument(fmt::format("refpool: {}: bytes {} are in use ({})", where, byte_range(u.address, u.bytes),
                                       u.span ? "a plan arena's span" : "a live buffer"));
  }
  // All idle: each leaves its slot (slot by slot, as detach_idle takes them), then the heap takes them back.
  for (const auto& holder : slots_.all) {
    const std::size_t from = pieces.size();
    for (std::size_t i = 0; i < used.size(); ++i)
      if (holders[i] == holder.get()) pieces.push_back(found[i]);
    detach_idle(*holder, pieces, from);
  }
  leave_all();
  return_pieces(h, pieces);
}

cache_state::idle_block_found cache_state::idle_block_at(std::uintptr_t address) {
  idle_block_found found;
  std::lock_guard guard(mutex_);
  intrude_all();
  for (const auto& holder : slots_.all)
    holder->buckets.for_each([&](const bucket& bk) {
      for (const block* b : bk.idle)
        if (address_of(b) == address) found = {b->capacity, b->backend};
    });
  leave_all();
  return found;
}

}  // namespace refpool::detail
