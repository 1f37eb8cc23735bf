// The pointer table behind to_pointer / free_pointer: buffers kept by address.
//
// A block handed to to_pointer gets a node under its address and keeps it until the block is
// destroyed, so the node outlives every alloc/free pair of a cached buffer. The node counts the
// hand-overs and, apart from them, the pointer_ref calls in flight (pins); while either is above 0
// the table holds one counted reference to the block, and whoever brings both to 0 drops it. A
// free takes only hand-overs, so a pin never lets a second free of one hand-over through.
// The common path takes no lock:
//  - to_pointer of a handle that is the block's only owner stores one hand-over (nobody else can
//    reach the block, and the table holds nothing of it: it would hold a reference);
//  - free_pointer finds the node through a seqlock (readers only load) and takes one hand-over
//    back with one compare-and-swap: of two frees of one hand-over that race, exactly one wins and
//    the other is reported as a double free.
// Nodes are added (a block's first to_pointer) and removed (~block) under their shard's spinlock;
// they are never freed, only reused, so a reader that found a node which was removed meanwhile
// reads a live object, and sees the change in its address.
#include "cache/block.hpp"

#include <refpool/error.hpp>
#include <refpool/pointer.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "access.hpp"
#include "cache/spinlock.hpp"

namespace refpool::detail {

struct pointer_node {
  std::atomic<std::uintptr_t> address{0};  ///< 0 while spare
  std::atomic<block*> owner{nullptr};
  /// Hand-overs kept (low half) and pointer_ref calls in flight (high half), changed together.
  /// Not 0: the table holds one reference to `owner`, which cannot change meanwhile.
  std::atomic<std::uint64_t> counts{0};
  pointer_node* next_spare = nullptr;  ///< under node_pool's mutex
};

namespace {

constexpr std::uint64_t one_hand_over = 1;
constexpr std::uint64_t one_pin = std::uint64_t{1} << 32;
constexpr std::uint32_t hand_overs(std::uint64_t counts) noexcept { return static_cast<std::uint32_t>(counts); }

/// Nodes are made 64 at a time and never freed (see the top of the file).
class node_pool {
 public:
  pointer_node* take() {
    std::lock_guard guard(mutex_);
    if (spare_ == nullptr) {
      auto* made = new pointer_node[64];  // std::bad_alloc: nothing changed
      for (int i = 0; i < 64; ++i) give_locked(&made[i]);
    }
    pointer_node* n = spare_;
    spare_ = n->next_spare;
    return n;
  }
  void give(pointer_node* n) noexcept {
    std::lock_guard guard(mutex_);
    give_locked(n);
  }

 private:
  void give_locked(pointer_node* n) noexcept {
    n->next_spare = spare_;
    spare_ = n;
  }
  std::mutex mutex_;
  pointer_node* spare_ = nullptr;
};

/// One shard: open addressing over node pointers (linear probing, backward-shift deletion, load
/// factor <= 1/2). Writers hold `lock`; readers (find) take no lock and retry when the sequence
/// number says a writer was inside (Boehm, "Can seqlocks get along with programming language
/// memory models?", 2012).
class alignas(64) shard {
 public:
  spinlock lock;

  /// The node kept under `address`, or null. Any thread, no lock.
  [[nodiscard]] pointer_node* find(std::uintptr_t address) const noexcept {
    for (;;) {
      const std::uint64_t before = seq_.load(std::memory_order_acquire);
      if ((before & 1) == 0) {
        pointer_node* found = probe(table_.load(std::memory_order_acquire), address);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (seq_.load(std::memory_order_relaxed) == before) return found;
      }
    }
  }
  /// find() for a writer (holds `lock`).
  [[nodiscard]] pointer_node* find_locked(std::uintptr_t address) const noexcept {
    return probe(table_.load(std::memory_order_relaxed), address);
  }

  /// Adds `n` (its address set, not in the table). Holds `lock`. May throw std::bad_alloc, then
  /// nothing changed.
  void insert(pointer_node* n) {
    table* t = table_.load(std::memory_order_relaxed);
    if (t == nullptr || (size_ + 1) * 2 > t->size()) t = grow(t);
    begin_write();
    place(*t, n);
    end_write();
    ++size_;
  }

  /// Takes `n` out. Holds `lock`; `n` is in the table.
  void erase(pointer_node* n) noexcept {
    table& t = *table_.load(std::memory_order_relaxed);
    const std::size_t mask = t.size() - 1;
    const std::uintptr_t address = n->address.load(std::memory_order_relaxed);
    std::size_t hole = home(address) & mask;
    while (t[hole].load(std::memory_order_relaxed) != n) hole = (hole + 1) & mask;
    begin_write();
    t[hole].store(nullptr, std::memory_order_relaxed);
    for (std::size_t i = (hole + 1) & mask;; i = (i + 1) & mask) {
      pointer_node* moved = t[i].load(std::memory_order_relaxed);
      if (moved == nullptr) break;
      const std::size_t h = home(moved->address.load(std::memory_order_relaxed)) & mask;
      if (((i - h) & mask) >= ((i - hole) & mask)) {
        t[hole].store(moved, std::memory_order_relaxed);
        t[i].store(nullptr, std::memory_order_relaxed);
        hole = i;
      }
    }
    end_write();
    --size_;
  }

 private:
  using table = std::vector<std::atomic<pointer_node*>>;

  static std::size_t home(std::uintptr_t address) noexcept {
    return static_cast<std::size_t>((address >> 8) * 0x9E3779B97F4A7C15ull >> 20);
  }
  static pointer_node* probe(const table* t, std::uintptr_t address) noexcept {
    if (t == nullptr) return nullptr;
    const std::size_t mask = t->size() - 1;
    // At most one lap: a reader between a writer's stores may see a table that is no state.
    for (std::size_t i = home(address) & mask, steps = 0; steps <= mask; i = (i + 1) & mask, ++steps) {
      pointer_node* n = (*t)[i].load(std::memory_order_relaxed);
      if (n == nullptr) return nullptr;
      if (n->address.load(std::memory_order_relaxed) == address) return n;
    }
    return nullptr;
  }
  static void place(table& t, pointer_node* n) noexcept {
    const std::size_t mask = t.size() - 1;
    std::size_t i = home(n->address.load(std::memory_order_relaxed)) & mask;
    while (t[i].load(std::memory_order_relaxed) != nullptr) i = (i + 1) & mask;
    t[i].store(n, std::memory_order_relaxed);
  }
  void begin_write() noexcept {
    seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  void end_write() noexcept { seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

  /// A table twice as large with every node of `old`, made current. Readers may still be in an
  /// older table, so every table made stays (they add up to less than the current one).
  table* grow(const table* old) {
    tables_.reserve(tables_.size() + 1);
    auto made = std::make_unique<table>(old == nullptr ? 16 : old->size() * 2);
    if (old != nullptr)
      for (const auto& slot : *old)
        if (pointer_node* n = slot.load(std::memory_order_relaxed)) place(*made, n);
    table* t = made.get();
    tables_.push_back(std::move(made));
    begin_write();
    table_.store(t, std::memory_order_release);
    end_write();
    return t;
  }

  std::atomic<std::uint64_t> seq_{0};  ///< odd while a writer changes the table
  std::atomic<table*> table_{nullptr};
  std::vector<std::unique_ptr<table>> tables_;
  std::size_t size_ = 0;
};

constexpr std::size_t shard_count = 64;

// Made while the library loads and never destroyed: blocks may die in static destructors.
std::array<shard, shard_count>* const shards = new std::array<shard, shard_count>;
node_pool* const nodes = new node_pool;

shard& shard_of(std::uintptr_t address) noexcept {
  // Buffers are at least 256-byte aligned: skip those bits and mix the rest, so neighbouring
  // buffers (of different threads, often) land in different shards.
  static_assert(shard_count == 64, "the top 6 bits of the product pick the shard");
  return (*shards)[((address >> 8) * 0x9E3779B97F4A7C15ull) >> 58];
}

[[noreturn]] void throw_unknown(const void* ptr, const char* what) {
  throw invalid_argument(
      fmt::format("refpool: {} of pointer {}: refpool keeps no buffer under it (never handed out by refpool, or "
                  "already freed: a double free)",
                  what, ptr));
}

/// `b`'s node, made on its first hand-over. May throw std::bad_alloc.
pointer_node& node_of(block& b, std::uintptr_t address) {
  pointer_node* seen = b.pointer.load(std::memory_order_acquire);
  if (seen != nullptr && seen->owner.load(std::memory_order_relaxed) == &b) [[likely]]
    return *seen;
  shard& s = shard_of(address);
  std::lock_guard guard(s.lock);
  if (pointer_node* n = b.pointer.load(std::memory_order_relaxed)) return *n;  // another handle made it
  if (pointer_node* n = s.find_locked(address)) {
    // Another block over the same bytes keeps its node: a region of another plan on a shared
    // arena, idle now (two live buffers never share an address). The node moves to `b`.
    block* before = n->owner.load(std::memory_order_relaxed);
    if (n->counts.load(std::memory_order_acquire) != 0)
      throw std::logic_error(fmt::format("refpool: two live buffers at {}: the pointer table is corrupt",
                                         reinterpret_cast<void*>(address)));
    before->pointer.store(nullptr, std::memory_order_release);
    n->owner.store(&b, std::memory_order_release);
    b.pointer.store(n, std::memory_order_release);
    return *n;
  }
  pointer_node* n = nodes->take();
  n->owner.store(&b, std::memory_order_relaxed);
  n->counts.store(0, std::memory_order_relaxed);
  n->address.store(address, std::memory_order_relaxed);
  try {
    s.insert(n);
  } catch (...) {
    n->address.store(0, std::memory_order_relaxed);
    nodes->give(n);
    throw;
  }
  b.pointer.store(n, std::memory_order_release);
  return *n;
}

/// What a change of a node's counts found.
struct counted {
  bool taken = false;      ///< false: the node keeps no hand-over for the address; nothing changed
  block* owner = nullptr;  ///< the block the table's reference is to, read while it held one
  bool last = false;       ///< the counts went to 0: the caller drops the table's reference to owner
};

/// Adds `delta` (a hand-over or pin, negative to take one back) to `n`'s counts for `address`,
/// when the node keeps at least one hand-over for it (a pin or free needs one; a pin going back
/// needs none).
counted change_counts(pointer_node& n, std::uintptr_t address, std::int64_t delta, bool need_hand_over) noexcept {
  std::uint64_t before = n.counts.load(std::memory_order_relaxed);
  block* owner = nullptr;
  do {
    if (need_hand_over && hand_overs(before) == 0) return {false, nullptr, false};
    owner = n.owner.load(std::memory_order_acquire);  // stable while the counts are not 0
  } while (!n.counts.compare_exchange_weak(before, before + static_cast<std::uint64_t>(delta),
                                           std::memory_order_acq_rel, std::memory_order_relaxed));
  const bool last = before + static_cast<std::uint64_t>(delta) == 0;
  if (n.address.load(std::memory_order_acquire) == address || !need_hand_over) [[likely]]
    return {true, owner, last};
  // The node was removed and reused for another buffer between find and the exchange (only a
  // stale address racing a reclaim of its buffer gets here): give the unit back. If that other
  // buffer's last hand-over was freed meanwhile, our unit was the last: its reference is ours to drop.
  const auto undo = static_cast<std::uint64_t>(delta);
  return {false, owner, n.counts.fetch_sub(undo, std::memory_order_acq_rel) == undo};
}

/// Drops the table's reference where a change of counts said so, then reports `ptr` unknown.
[[noreturn]] void refuse(const counted& c, const void* ptr, const char* what) {
  if (c.last) drop_reference(c.owner, false);
  throw_unknown(ptr, what);
}

}  // namespace

void forget_pointer(block& b) noexcept {
  shard& s = shard_of(reinterpret_cast<std::uintptr_t>(b.ptr));  // where node_of put it
  std::lock_guard guard(s.lock);
  pointer_node* n = b.pointer.load(std::memory_order_relaxed);  // a block over the same bytes may have taken it
  if (n == nullptr) return;
  b.pointer.store(nullptr, std::memory_order_relaxed);
  s.erase(n);
  n->owner.store(nullptr, std::memory_order_relaxed);
  n->address.store(0, std::memory_order_release);
  nodes->give(n);
}

}  // namespace refpool::detail

namespace refpool {

void* to_pointer(data_ref&& ref) {
  detail::block_header* h = detail::access::block(ref);
  void* address = ref.data();  // throws use_after_free for a freed handle, before anything changes
  if (h == nullptr) return nullptr;
  detail::pointer_node& n = detail::node_of(*detail::as_block(h), reinterpret_cast<std::uintptr_t>(address));
  if (h->refs.only_owner()) {
    // Nobody else reaches the block, and the table holds nothing of it (that would be a second
    // reference): the handle's reference becomes the table's.
    n.counts.store(detail::one_hand_over, std::memory_order_release);  // as the shared path's CAS
    detail::access::release_into_table(ref);
    return address;
  }
  // Shared: other hand-overs, frees and pins of this buffer may run now.
  std::uint64_t before = n.counts.load(std::memory_order_relaxed);
  do {
    if (detail::hand_overs(before) == UINT32_MAX)
      throw invalid_argument(
          fmt::format("refpool: to_pointer: buffer {} is handed over {} times already", address, UINT32_MAX));
  } while (!n.counts.compare_exchange_weak(before, before + detail::one_hand_over, std::memory_order_acq_rel,
                                           std::memory_order_relaxed));
  if (before == 0) {
    detail::access::release_into_table(ref);  // the first hand-over: the table keeps this reference
  } else {
    ref = data_ref();  // the table holds one already; never the last reference
  }
  return address;
}

void free_pointer(void* ptr) {
  if (ptr == nullptr) return;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  detail::pointer_node* n = detail::shard_of(address).find(address);
  const detail::counted c = n == nullptr ? detail::counted{} : detail::change_counts(*n, address, -1, true);
  if (!c.taken) detail::refuse(c, ptr, "free");
  // The last hand-over, no pin in flight: the table's reference goes (else the last pin drops it).
  if (c.last) detail::drop_reference(c.owner, false);
}

data_ref pointer_ref(void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  detail::pointer_node* n = ptr == nullptr ? nullptr : detail::shard_of(address).find(address);
  // A pin while the new handle is made, so the table's reference cannot go meanwhile. It counts
  // apart from hand-overs: frees racing it still free each hand-over once.
  const auto pin = static_cast<std::int64_t>(detail::one_pin);
  const detail::counted pinned = n == nullptr ? detail::counted{} : detail::change_counts(*n, address, pin, true);
  if (!pinned.taken) detail::refuse(pinned, ptr, "pointer_ref");
  pinned.owner->refs.increment();
  const detail::counted unpinned = detail::change_counts(*n, address, -pin, false);
  if (unpinned.last) detail::drop_reference(pinned.owner, false);  // its last hand-over was freed meanwhile
  return detail::access::adopt(pinned.owner);
}

}  // namespace refpool
