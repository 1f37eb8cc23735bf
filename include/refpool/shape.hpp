// `shape`: the dims of an array, any rank, stored inline up to a small rank.
#pragma once

#include <refpool/detail/export.hpp>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace refpool {

/// Dims of an array (row-major). Ranks up to `inline_rank` need no heap allocation.
/// A rank-0 shape has one element (a scalar); a shape with a zero dim has none.
class REFPOOL_API shape {
 public:
  static constexpr std::size_t inline_rank = 6;

  shape() noexcept = default;
  shape(std::initializer_list<std::size_t> dims) { assign(dims.begin(), dims.size()); }
  explicit shape(std::span<const std::size_t> dims) { assign(dims.data(), dims.size()); }
  shape(const shape& other) { assign(other.data(), other.rank_); }
  shape& operator=(const shape& other) {
    if (this != &other) assign(other.data(), other.rank_);
    return *this;
  }
  // A moved-from shape is rank 0.
  shape(shape&& other) noexcept { take(other); }
  shape& operator=(shape&& other) noexcept {
    if (this != &other) take(other);
    return *this;
  }
  ~shape() = default;

  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t operator[](std::size_t i) const noexcept { return data()[i]; }
  [[nodiscard]] const std::size_t* begin() const noexcept { return data(); }
  [[nodiscard]] const std::size_t* end() const noexcept { return data() + rank_; }
  [[nodiscard]] std::span<const std::size_t> dims() const noexcept { return {data(), rank_}; }

  /// Product of the dims. Throws `size_error` naming the dims if it overflows std::size_t.
  [[nodiscard]] std::size_t element_count() const;

  /// "(4, 4)", "()" for rank 0.
  [[nodiscard]] std::string to_string() const;

  friend bool operator==(const shape& a, const shape& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  [[nodiscard]] const std::size_t* data() const noexcept { return heap_ ? heap_.get() : inline_; }
  void take(shape& other) noexcept {
    std::copy_n(other.inline_, inline_rank, inline_);
    heap_ = std::move(other.heap_);
    rank_ = std::exchange(other.rank_, 0);
  }
  void assign(const std::size_t* dims, std::size_t rank) {
    std::size_t* out = inline_;
    if (rank > inline_rank) {
      heap_ = std::make_unique<std::size_t[]>(rank);
      out = heap_.get();
    } else {
      heap_.reset();
    }
    std::copy_n(dims, rank, out);
    rank_ = rank;
  }

  std::size_t rank_ = 0;
  std::size_t inline_[inline_rank] = {};
  std::unique_ptr<std::size_t[]> heap_;
};

}  // namespace refpool
