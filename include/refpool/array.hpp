// `array<T>`: a typed, shaped view over a data_ref. Arrays are not cached; buffers are. A cached
// buffer of N bytes serves any shape and element type of N bytes by building a new view.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include <refpool/data_ref.hpp>
#include <refpool/shape.hpp>

namespace refpool {

namespace detail {
/// `count * element_size`, throwing `size_error` naming `dims` on overflow.
REFPOOL_API std::size_t checked_bytes(const shape& dims, std::size_t element_size);
/// Element count of a view of `dims` at element `offset` into `buffer_bytes`; throws
/// `shape_error` if it does not fit, `size_error` on overflow.
REFPOOL_API std::size_t checked_view(const shape& dims, std::size_t element_size, std::size_t offset,
                                     std::size_t buffer_bytes);
[[noreturn]] REFPOOL_API void throw_reshape_error(const shape& from, std::size_t from_elem, const shape& to,
                                                  std::size_t to_elem);
[[noreturn]] REFPOOL_API void throw_offset_error(std::size_t byte_offset, std::size_t to_elem);
}  // namespace detail

template <class T>
class array;

/// A new uninitialised array of `dims`: through the innermost active scope's cache on this
/// thread, else directly from `be`. Zero elements allocate nothing. Throws `size_error`
/// (overflowing dims), `out_of_memory`, `backend_error`.
template <class T>
[[nodiscard]] array<T> empty(const backend& be, shape dims, stream_ref stream = {});

/// A view of `dims` elements of `T` (row-major), starting `offset()` elements into a buffer.
///
/// Copies share the buffer (they copy the data_ref). `unsafe_free()` releases this view's
/// reference at once; later `data()`, `reshape`, copies through it throw `use_after_free`.
/// A zero-element array owns no buffer and `data()` returns nullptr. A rank-0 array is a
/// scalar: one element. Thread safety: as data_ref.
template <class T>
class array {
  static_assert(std::is_trivially_copyable_v<T> && !std::is_const_v<T>,
                "refpool arrays hold trivially copyable, non-const element types");

 public:
  using value_type = T;

  array() = default;
  array(const array&) = default;
  array& operator=(const array&) = default;
  /// A move leaves the source like a default array: no buffer and no elements (the implicit
  /// move kept the source's size() and offset() with a null data()).
  array(array&& other) noexcept
      : ref_(std::move(other.ref_)),
        dims_(std::move(other.dims_)),
        size_(std::exchange(other.size_, 0)),
        offset_(std::exchange(other.offset_, 0)) {}
  array& operator=(array&& other) noexcept {
    if (this != &other) {
      ref_ = std::move(other.ref_);
      dims_ = std::move(other.dims_);
      size_ = std::exchange(other.size_, 0);
      offset_ = std::exchange(other.offset_, 0);
    }
    return *this;
  }
  ~array() = default;

  /// A view over `ref`. Throws `shape_error` if `offset + count` elements do not fit
  /// `ref.bytes()`, `size_error` if the dims overflow, `use_after_free` if `ref` was freed.
  array(data_ref ref, shape dims, std::size_t offset = 0)
      : ref_(std::move(ref)), dims_(std::move(dims)), offset_(offset) {
    // A freed `ref` moved in is still freed: bytes() throws use_after_free.
    size_ = detail::checked_view(dims_, sizeof(T), offset_, ref_ || ref_.is_freed() ? ref_.bytes() : 0);
    if (size_ == 0) ref_.reset();  // zero elements own no buffer (data() is nullptr), as from empty<T>
  }

  /// First element; nullptr for a zero-element array. Throws `use_after_free`.
  [[nodiscard]] T* data() const {
    void* base = ref_.data();
    return base == nullptr ? nullptr : static_cast<T*>(base) + offset_;
  }
  [[nodiscard]] const shape& dims() const noexcept { return dims_; }
  [[nodiscard]] std::size_t rank() const noexcept { return dims_.rank(); }
  /// Number of elements.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  /// Offset of the first element into the buffer, in elements.
  [[nodiscard]] std::size_t offset() const noexcept { return offset_; }

  /// The same elements with other dims, sharing the buffer. Throws `shape_error` (with both
  /// shapes) if the element count differs, `use_after_free` after unsafe_free().
  [[nodiscard]] array reshape(shape new_dims) const {
    if (new_dims.element_count() != size_) detail::throw_reshape_error(dims_, sizeof(T), new_dims, sizeof(T));
    return array(ref_, std::move(new_dims), offset_, size_);
  }

  /// The same bytes as elements of `U` with `new_dims`; the byte size must match exactly and
  /// the start must be aligned for `U`. Throws `shape_error`, `use_after_free`.
  template <class U>
  [[nodiscard]] array<U> reinterpret(shape new_dims) const {
    const std::size_t new_bytes = detail::checked_bytes(new_dims, sizeof(U));
    if (new_bytes != bytes()) detail::throw_reshape_error(dims_, sizeof(T), new_dims, sizeof(U));
    const std::size_t byte_offset = offset_ * sizeof(T);
    if (byte_offset % sizeof(U) != 0 || byte_offset % alignof(U) != 0)
      detail::throw_offset_error(byte_offset, sizeof(U));
    return array<U>(ref_, std::move(new_dims), byte_offset / sizeof(U));
  }
  /// As above, with dims kept when sizeof(U) == sizeof(T) and flattened otherwise.
  template <class U>
  [[nodiscard]] array<U> reinterpret() const {
    if constexpr (sizeof(U) == sizeof(T)) {
      return reinterpret<U>(dims_);
    } else {
      return reinterpret<U>(shape{bytes() / sizeof(U)});
    }
  }

  /// Releases this view's reference to the buffer now (see data_ref::unsafe_free).
  void unsafe_free() noexcept { ref_.unsafe_free(); }
  [[nodiscard]] bool is_freed() const noexcept { return ref_.is_freed(); }
  /// Handles sharing the buffer (views and data_refs); 0 when freed or zero-element.
  [[nodiscard]] long use_count() const noexcept { return ref_.use_count(); }
  [[nodiscard]] const data_ref& ref() const noexcept { return ref_; }
  /// See data_ref::record_stream.
  void record_stream(stream_ref s) const { ref_.record_stream(s); }

 private:
  template <class>
  friend class array;
  template <class U>
  friend array<U> empty(const backend&, shape, stream_ref);
  // Trusted constructor: dims already checked against the buffer.
  array(data_ref ref, shape dims, std::size_t offset, std::size_t size)
      : ref_(std::move(ref)), dims_(std::move(dims)), size_(size), offset_(offset) {}

  data_ref ref_;
  shape dims_;
  std::size_t size_ = 0;
  std::size_t offset_ = 0;
};

template <class T>
array<T> empty(const backend& be, shape dims, stream_ref stream) {
  const std::size_t bytes = detail::checked_bytes(dims, sizeof(T));
  data_ref ref = bytes == 0 ? data_ref{} : allocate(be, bytes, stream);
  return array<T>(std::move(ref), std::move(dims), 0, bytes / sizeof(T));
}

}  // namespace refpool
