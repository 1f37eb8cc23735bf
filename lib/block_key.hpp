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
    h ^= (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.device)) << 8 |
          static_cast<std::uint64_t>(k.kind)) + (h << 6) + (h >> 2);
    h ^= k.alignment + (h << 6) + (h >> 2);
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};

/// Owns one `Value` per key (Value has a `key` member). Pointers to values stay valid for the
/// map's life. Not thread-safe: its owner's lock guards it. `Hash` is injectable for tests.
template <class Value, class Hash = block_key_hash>
class key_map {
 public:
  explicit key_map(Hash hash = Hash{}) : hash_(std::move(hash)) { table_.resize(initial_capacity); }

  [[nodiscard]] Value* find(const block_key& key) const noexcept {
    const std::size_t h = hash_(key);
    for (std::size_t i = h & mask();; i = (i + 1) & mask()) {
      const entry& e = table_[i];
      if (e.value == nullptr) return nullptr;
      if (e.hash == h && e.value->key == key) return e.value;
    }
  }

  /// The value for `key`, made by `make()` (returning unique_ptr<Value>) if absent.
  template <class Make>
  Value& find_or_insert(const block_key& key, Make&& make) {
    if (Value* v = find(key)) return *v;
    if ((values_.size() + 1) * 2 > table_.size()) grow();
    values_.push_back(make());
    insert(hash_(key), values_.back().get());
    return *values_.back();
  }

  template <class F>
  void for_each(F&& f) const {
    for (const auto& v : values_) f(*v);
  }
  [[nodiscard]] std::size_t size() const noexcept { return values_.size(); }

 private:
  static constexpr std::size_t initial_capacity = 16;  // power of two
  struct entry {
    std::size_t hash = 0;
    Value* value = nullptr;
  };
  [[nodiscard]] std::size_t mask() const noexcept { return table_.size() - 1; }
  void insert(std::size_t h, Value* v) noexcept {
    std::size_t i = h & mask();
    while (table_[i].value != nullptr) i = (i + 1) & mask();
    table_[i] = {h, v};
  }
  void grow() {
    std::vector<entry> old(table_.size() * 2);
    old.swap(table_);
    for (const entry& e : old)
      if (e.value != nullptr) insert(e.hash, e.value);
  }

  Hash hash_;
  std::vector<entry> table_;
  std::vector<std::unique_ptr<Value>> values_;
};

}  // namespace refpool::detail
