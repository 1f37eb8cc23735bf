// free_index: the free ranges of one pool, ordered for best fit, with node storage reserved
// ahead so that inserting and erasing never allocate (a heap change that has begun never fails
// half way; give_back never throws).
#pragma once

#include <cstddef>
#include <set>
#include <vector>

#include "segment.hpp"

namespace refpool::detail {

class free_index {
  struct by_size_then_address {
    bool operator()(const range* a, const range* b) const noexcept {
      return a->bytes != b->bytes ? a->bytes < b->bytes : a->address < b->address;
    }
  };
  using set_type = std::set<range*, by_size_then_address>;

 public:
  using const_iterator = set_type::const_iterator;

  /// Makes sure `count` insertions can follow without allocating. Throws std::bad_alloc.
  void reserve(std::size_t count) {
    while (spares_.size() < count) {
      // Spare capacity first, so that erase() can always keep the node it frees.
      if (spares_.capacity() < set_.size() + spares_.size() + 1)
        spares_.reserve(2 * (set_.size() + spares_.size() + 1));
      set_type scratch;
      scratch.insert(nullptr);
      spares_.push_back(scratch.extract(scratch.begin()));
    }
  }
  /// Inserts a free range whose size and address are final. Needs a reserved node.
  void insert(range* r) noexcept {
    set_type::node_type node = std::move(spares_.back());
    spares_.pop_back();
    node.value() = r;
    set_.insert(std::move(node));
  }
  /// Erases a free range (before its size or address changes); its node becomes a spare.
  void erase(range* r) noexcept { spares_.push_back(set_.extract(r)); }

  /// The smallest free range of at least `bytes`, lowest address first among equal sizes.
  [[nodiscard]] const_iterator lower_bound(std::size_t bytes) const noexcept {
    range probe;
    probe.bytes = bytes;
    probe.address = 0;
    return set_.lower_bound(&probe);
  }
  [[nodiscard]] const_iterator end() const noexcept { return set_.end(); }
  [[nodiscard]] const_iterator begin() const noexcept { return set_.begin(); }
  [[nodiscard]] std::size_t size() const noexcept { return set_.size(); }
  [[nodiscard]] std::size_t largest() const noexcept { return set_.empty() ? 0 : (*set_.rbegin())->bytes; }
  [[nodiscard]] bool contains(range* r) const noexcept { return set_.count(r) != 0; }

 private:
  set_type set_;
  std::vector<set_type::node_type> spares_;
};

}  // namespace refpool::detail
