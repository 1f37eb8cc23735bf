// The pointer table behind to_pointer / free_pointer: buffers kept by address. 64 shards picked
// by a hash of the address, each a small open-addressing map under its own spinlock, so frees of
// one thread rarely meet another thread's. The common path is one lock and a probe or two.
#include <refpool/error.hpp>
#include <refpool/pointer.hpp>

#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "access.hpp"
#include "cache/slot.hpp"  // line_allocator
#include "cache/spinlock.hpp"

namespace refpool {

namespace detail {
namespace {

struct entry {
  std::uintptr_t address = 0;  ///< 0: empty (no buffer lives at address 0)
  block_header* block = nullptr;
  std::size_t count = 0;       ///< references kept for this address
};

/// One shard: linear probing, backward-shift deletion (no tombstones), load factor <= 1/2.
class alignas(64) shard {
 public:
  /// Adds one reference for `address`.
  void insert(std::uintptr_t address, block_header* block) {
    std::lock_guard guard(lock_);
    if (table_.empty() || (size_ + 1) * 2 > table_.size()) grow();  // may throw: nothing changed
    std::size_t i = home(address);
    while (table_[i].address != 0 && table_[i].address != address) i = (i + 1) & mask();
    if (table_[i].address == 0) {
      table_[i] = entry{address, block, 0};
      ++size_;
    }
    table_[i].count += 1;
  }

  /// Takes one reference for `address` out; null when none is kept.
  block_header* remove(std::uintptr_t address) noexcept {
    std::lock_guard guard(lock_);
    const std::size_t found = find(address);
    if (found == npos) return nullptr;
    block_header* block = table_[found].block;
    if (--table_[found].count == 0) erase_at(found);
    return block;
  }

  /// A new counted handle on the buffer kept under `address`; null when none.
  block_header* share(std::uintptr_t address) noexcept {
    std::lock_guard guard(lock_);
    const std::size_t found = find(address);
    if (found == npos) return nullptr;
    table_[found].block->refs.increment();
    return table_[found].block;
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  [[nodiscard]] std::size_t mask() const noexcept { return table_.size() - 1; }
  [[nodiscard]] std::size_t home(std::uintptr_t address) const noexcept {
    return static_cast<std::size_t>((address >> 8) * 0x9E3779B97F4A7C15ull >> 20) & mask();
  }
  [[nodiscard]] std::size_t find(std::uintptr_t address) const noexcept {
    if (table_.empty()) return npos;
    for (std::size_t i = home(address);; i = (i + 1) & mask()) {
      if (table_[i].address == address) return i;
      if (table_[i].address == 0) return npos;
    }
  }
  void erase_at(std::size_t hole) noexcept {
    table_[hole] = entry{};
    --size_;
    for (std::size_t i = (hole + 1) & mask(); table_[i].address != 0; i = (i + 1) & mask()) {
      const std::size_t h = home(table_[i].address);
      if (((i - h) & mask()) >= ((i - hole) & mask())) {
        table_[hole] = table_[i];
        table_[i] = entry{};
        hole = i;
      }
    }
  }
  void grow() {
    std::vector<entry, line_allocator<entry>> old(table_.empty() ? 16 : table_.size() * 2);
    old.swap(table_);
    for (const entry& e : old) {
      if (e.address == 0) continue;
      std::size_t i = home(e.address);
      while (table_[i].address != 0) i = (i + 1) & mask();
      table_[i] = e;
    }
  }

  spinlock lock_;
  // Whole cache lines: tables of shards that different threads use never share one.
  std::vector<entry, line_allocator<entry>> table_;
  std::size_t size_ = 0;
};

constexpr std::size_t shard_count = 64;

// Made while the library loads and never destroyed: frees may come from static destructors.
std::array<shard, shard_count>* const shards = new std::array<shard, shard_count>;

shard& shard_of(std::uintptr_t address) noexcept {
  // Buffers are at least 256-byte aligned: skip those bits and mix the rest, so neighbouring
  // buffers (of different threads, often) land in different shards.
  static_assert(shard_count == 64, "the top 6 bits of the product pick the shard");
  return (*shards)[((address >> 8) * 0x9E3779B97F4A7C15ull) >> 58];
}

[[noreturn]] void throw_unknown(const void* ptr, const char* what) {
  throw invalid_argument(fmt::format(
      "refpool: {} of pointer {}: refpool keeps no buffer under it (never handed out by refpool, or "
      "already freed: a double free)",
      what, ptr));
}

}  // namespace
}  // namespace detail

void* to_pointer(data_ref&& ref) {
  detail::block_header* b = detail::access::block(ref);
  void* address = ref.data();  // throws use_after_free for a freed handle, before anything changes
  if (b == nullptr) return nullptr;
  detail::shard_of(reinterpret_cast<std::uintptr_t>(address)).insert(reinterpret_cast<std::uintptr_t>(address), b);
  detail::access::release_into_table(ref);  // the table holds the reference now
  return address;
}

void free_pointer(void* ptr) {
  if (ptr == nullptr) return;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  detail::block_header* b = detail::shard_of(address).remove(address);
  if (b == nullptr) detail::throw_unknown(ptr, "free");
  detail::drop_reference(b, false);
}

data_ref pointer_ref(void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  detail::block_header* b = ptr == nullptr ? nullptr : detail::shard_of(address).share(address);
  if (b == nullptr) detail::throw_unknown(ptr, "pointer_ref");
  return detail::access::adopt(b);
}

}  // namespace refpool
