// Cache keys: lookups compare the whole key, so colliding hashes never cross-serve.
#include <catch2/catch.hpp>

#include "cache/block_key.hpp"

using namespace refpool::detail;

namespace {
struct colliding_hash {
  std::size_t operator()(const block_key&) const noexcept { return 42; }  // every key collides
};
struct value {
  block_key key;
  int tag = 0;
};
}  // namespace

TEST_CASE("keys whose hashes collide map to distinct values", "[keys]") {
  key_map<value, colliding_hash> map;
  const auto* backend_a = reinterpret_cast<const backend_state*>(0x1000);
  const auto* backend_b = reinterpret_cast<const backend_state*>(0x2000);
  const block_key keys[] = {
      {backend_a, 0, refpool::memory_kind::device, 256, 1024},
      {backend_b, 0, refpool::memory_kind::device, 256, 1024},       // another backend
      {backend_a, 1, refpool::memory_kind::device, 256, 1024},       // another device
      {backend_a, 0, refpool::memory_kind::pinned_host, 256, 1024},  // another kind
      {backend_a, 0, refpool::memory_kind::device, 512, 1024},       // another alignment
      {backend_a, 0, refpool::memory_kind::device, 256, 2048},       // another size
  };
  int tag = 0;
  for (const block_key& k : keys) {
    ++tag;
    value& v = map.find_or_insert(k, [&] { return std::make_unique<value>(value{k, tag}); });
    CHECK(v.tag == tag);  // never an earlier key's value
  }
  CHECK(map.size() == std::size(keys));
  tag = 0;
  for (const block_key& k : keys) {
    ++tag;
    REQUIRE(map.find(k) != nullptr);
    CHECK(map.find(k)->tag == tag);
    CHECK(map.find(k)->key == k);
  }
  CHECK(map.find({backend_b, 1, refpool::memory_kind::host, 1, 1}) == nullptr);
  CHECK(colliding_hash{}(keys[0]) == colliding_hash{}(keys[5]));
}

TEST_CASE("the map keeps values in place while it grows", "[keys]") {
  key_map<value> map;
  std::vector<value*> seen;
  for (std::size_t bytes = 1; bytes <= 1000; ++bytes) {
    const block_key k{nullptr, 0, refpool::memory_kind::host, 256, bytes};
    seen.push_back(&map.find_or_insert(k, [&] { return std::make_unique<value>(value{k, static_cast<int>(bytes)}); }));
  }
  for (std::size_t bytes = 1; bytes <= 1000; ++bytes)
    CHECK(map.find({nullptr, 0, refpool::memory_kind::host, 256, bytes}) == seen[bytes - 1]);
}
