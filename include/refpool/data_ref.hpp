// `data_ref`: the refcounted handle to one buffer. Arrays are views over a data_ref; the cache
// recycles a buffer only when its count of data_refs reaches zero.
#pragma once

#include <cstddef>
#include <utility>

#include <refpool/backend.hpp>
#include <refpool/detail/block_header.hpp>
#include <refpool/detail/export.hpp>
#include <refpool/types.hpp>

namespace refpool {

/// Shared ownership of one buffer (a block: one backend allocation, or a region of one).
///
/// Copies share the buffer (relaxed increment); a move leaves the source null. When the last
/// data_ref of a buffer goes away, the buffer returns to the cache that handed it out, or to
/// its backend when no cache owns it.
///
/// A null handle (default-constructed, moved from, or from a request of 0 bytes) owns nothing:
/// `data()` is nullptr and `bytes()` 0.
///
/// `unsafe_free()` releases this handle's reference now, before its destructor runs; afterwards
/// `data()`, copies and views through this handle throw `use_after_free`, naming the buffer.
///
/// Thread safety: distinct handles to one buffer may be copied and destroyed concurrently
/// (like std::shared_ptr); one handle must not be mutated concurrently.
class REFPOOL_API data_ref {
 public:
  data_ref() noexcept = default;
  /// Throws `use_after_free` if `other` was unsafe_freed.
  data_ref(const data_ref& other) : block_(other.live("copy")) {
    if (block_ != nullptr) block_->refs.increment();
  }
  data_ref(data_ref&& other) noexcept { steal(other); }
  /// Throws `use_after_free` if `other` was unsafe_freed (this handle is then unchanged).
  data_ref& operator=(const data_ref& other);
  data_ref& operator=(data_ref&& other) noexcept;
  ~data_ref() { reset(); }

  /// Device address (host address for host memory); nullptr for a null handle.
  /// Throws `use_after_free` after unsafe_free().
  [[nodiscard]] void* data() const {
    const detail::block_header* b = live("data()");
    return b == nullptr ? nullptr : b->ptr;
  }
  /// Bytes requested for this buffer (the block may be larger: see capacity()).
  /// Throws `use_after_free` after unsafe_free().
  [[nodiscard]] std::size_t bytes() const {
    const detail::block_header* b = live("bytes()");
    return b == nullptr ? 0 : b->requested;
  }
  /// Bytes of the underlying block (requested bytes after the cache's rounding).
  /// Throws `use_after_free` after unsafe_free().
  [[nodiscard]] std::size_t capacity() const {
    const detail::block_header* b = live("capacity()");
    return b == nullptr ? 0 : b->capacity;
  }
  /// Number of data_refs sharing the buffer; 0 for null or freed handles.
  [[nodiscard]] long use_count() const noexcept {
    return block_ == nullptr ? 0 : static_cast<long>(block_->refs.load());
  }
  /// The backend the buffer came from (a null backend for a null handle).
  /// Throws `use_after_free` after unsafe_free().
  [[nodiscard]] backend source() const;
  /// The stream the buffer was last handed out for.
  [[nodiscard]] stream_ref stream() const;

  /// Tells the cache that the buffer is also used on `s`, so that a later reuse on another
  /// stream, and the memory's free to the backend, wait for `s` too (PyTorch's recordStream).
  /// Throws `use_after_free` after unsafe_free().
  void record_stream(stream_ref s) const;

  /// Releases this handle's reference now; idempotent. Never throws, never double-frees.
  void unsafe_free() noexcept;
  /// True after unsafe_free() on this handle (or on the handle it was moved from).
  [[nodiscard]] bool is_freed() const noexcept { return freed_bytes_ != 0; }
  /// Drops the reference (like destruction) and makes the handle null.
  void reset() noexcept {
    if (block_ != nullptr) detail::drop_reference(std::exchange(block_, nullptr), false);
    freed_ptr_ = nullptr;
    freed_bytes_ = 0;
  }

  explicit operator bool() const noexcept { return block_ != nullptr; }

 private:
  friend struct detail::access;
  explicit data_ref(detail::block_header* adopted) noexcept : block_(adopted) {}

  void steal(data_ref& other) noexcept {
    block_ = std::exchange(other.block_, nullptr);
    freed_ptr_ = std::exchange(other.freed_ptr_, nullptr);
    freed_bytes_ = std::exchange(other.freed_bytes_, 0);
  }
  /// The block (maybe null); throws use_after_free naming `what` after unsafe_free().
  [[nodiscard]] detail::block_header* live(const char* what) const {
    if (is_freed()) [[unlikely]]
      throw_freed(what);
    return block_;
  }
  [[noreturn]] void throw_freed(const char* what) const;

  detail::block_header* block_ = nullptr;
  // After unsafe_free: what the buffer was, so errors can name it (the block may be reused).
  void* freed_ptr_ = nullptr;
  std::size_t freed_bytes_ = 0;
};

/// Allocates `bytes` from `be` for use on `stream`: through the innermost active scope's cache
/// on this thread, or directly from `be` when none is active. A request of 0 bytes returns a
/// null handle and allocates nothing.
/// Throws `invalid_argument` (null backend), `size_error` (a size that overflows when rounded or
/// aligned), `out_of_memory`, `backend_error`.
[[nodiscard]] REFPOOL_API data_ref allocate(const backend& be, std::size_t bytes, stream_ref stream = {});

}  // namespace refpool
