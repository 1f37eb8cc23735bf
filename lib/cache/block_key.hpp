// The full key of a cached block, and a small open-addressing map from keys to buckets.
// Lookups compare the whole key; the hash only picks where to start probing.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <refpool/types.hpp>

namespace refpool::detail {

class backend_state;

struct block_key {
  const backend_state* backend = nullptr;
  device_id device = 0;
  memory_kind kind = memory_kind::host;
  std::size_t alignment = 0;
  std::size_t bytes = 0;  ///< rounded request size = block capacity
  friend bool operator==(const block_key&, const block_key&) = default;
};

struct block_key_hash {
  std::size_t operator()(const block_key& k) const noexcept {
    // Sizes dominate: mix them well, fold the rest in.
    std::uint64_t h = k.bytes * 0x9E3779B97F4A7C15ull;
    h ^= reinterpret_cast<std::uintptr_t>(k.backend) + (h << 6) + (h >> 2);
    h ^= (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.device)) << 8 | static_cast<std::uint64_t>(k.kind)) +
         (h << 6) + (h >> 2);
    h ^= k.alignment + (h << 6) + (h >> 2);
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};

/// Owns one `Value` per key (Value has a `key` member). Pointers to values stay valid until
/// their key is erased. Open addressing with linear probing and backward-shift deletion, so
/// erasing leaves no tombstones behind. Not thread-safe: its owner's lock guards it. `Hash` is
/// injectable for tests.
template <class Value, class Hash = block_key_hash>
class key_map {
 public:
  explicit key_map(Hash hash = Hash{}) : hash_(std::move(hash)) { table_.resize(initial_capacity); }

  [[nodiscard]] Value* find(const block_key& key) const noexcept {
    const std::size_t i = index_of(key);
    return i == npos ? nullptr : table_[i].value.get();
  }

  /// The value for `key`, made by `make()` (returning unique_ptr<Value>) if absent.
  template <class Make>
  Value& find_or_insert(const block_key& key, Make&& make) {
    if (Value* v = find(key)) return *v;
    if ((size_ + 1) * 2 > table_.size()) grow();
    std::unique_ptr<Value> made = make();
    Value& out = *made;
    insert(hash_(key), std::move(made));
    ++size_;
    return out;
  }

  /// Destroys the value of `key`, if any.
  void erase(const block_key& key) noexcept { extract(key); }

  /// Takes the value of `key` out of the map (null if absent).
  std::unique_ptr<Value> extract(const block_key& key) noexcept {
    std::size_t hole = index_of(key);
    if (hole == npos) return nullptr;
    std::unique_ptr<Value> out = std::move(table_[hole].value);
    table_[hole] = entry{};
    --size_;
    // Backward shift: move later entries of the probe run into the hole when their home allows.
    for (std::size_t i = (hole + 1) & mask(); table_[i].value != nullptr; i = (i + 1) & mask()) {
      const std::size_t home = table_[i].hash & mask();
      const bool reachable_from_hole = ((i - home) & mask()) >= ((i - hole) & mask());
      if (reachable_from_hole) {
        table_[hole] = std::move(table_[i]);
        hole = i;
      }
    }
    return out;
  }

  template <class F>
  void for_each(F&& f) const {
    for (const entry& e : table_)
      if (e.value != nullptr) f(*e.value);
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  static constexpr std::size_t initial_capacity = 16;  // power of two
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  struct entry {
    std::size_t hash = 0;
    std::unique_ptr<Value> value;
  };
  [[nodiscard]] std::size_t mask() const noexcept { return table_.size() - 1; }
  [[nodiscard]] std::size_t index_of(const block_key& key) const noexcept {
    const std::size_t h = hash_(key);
    for (std::size_t i = h & mask();; i = (i + 1) & mask()) {
      const entry& e = table_[i];
      if (e.value == nullptr) return npos;
      if (e.hash == h && e.value->key == key) return i;
    }
  }
  void insert(std::size_t h, std::unique_ptr<Value> v) noexcept {
    std::size_t i = h & mask();
    while (table_[i].value != nullptr) i = (i + 1) & mask();
    table_[i] = entry{h, std::move(v)};
  }
  void grow() {
    std::vector<entry> old(table_.size() * 2);
    old.swap(table_);
    for (entry& e : old)
      if (e.value != nullptr) insert(e.hash, std::move(e.value));
  }

  Hash hash_;
  std::vector<entry> table_;
  std::size_t size_ = 0;
};

}  // namespace refpool::detail
