// data_ref: what is not inline (assignments, source, streams, unsafe_free, the freed-handle error).
// Where a block goes after its last handle is the release path (allocate.cpp).
#include <refpool/data_ref.hpp>
#include <refpool/error.hpp>

#include <algorithm>
#include <mutex>

#include <fmt/format.h>

#include "access.hpp"
#include "cache/block.hpp"

namespace refpool {

void data_ref::throw_freed(const char* what) const {
  throw use_after_free(fmt::format(
      "refpool: use after unsafe_free: {} through a handle whose buffer {} ({} B) it released with unsafe_free()", what,
      freed_ptr_, freed_bytes_));
}

data_ref& data_ref::operator=(const data_ref& other) {
  if (this != &other) {
    data_ref copy(other);  // throws before this handle changes
    *this = std::move(copy);
  }
  return *this;
}

data_ref& data_ref::operator=(data_ref&& other) noexcept {
  if (this != &other) {
    reset();
    steal(other);
  }
  return *this;
}

backend data_ref::source() const {
  const detail::block_header* h = live("source()");
  if (h == nullptr) return {};
  detail::backend_state* state = detail::as_block(h)->backend;
  state->retain();
  return detail::access::adopt(state);
}

stream_ref data_ref::stream() const {
  const detail::block_header* h = live("stream()");
  return h == nullptr ? stream_ref{} : detail::as_block(h)->last_stream;
}

void data_ref::record_stream(stream_ref s) const {
  detail::block_header* h = live("record_stream()");
  if (h == nullptr) return;
  detail::block* b = detail::as_block(h);
  std::lock_guard guard(b->streams_lock);
  if (s != b->last_stream && std::find(b->extra_streams.begin(), b->extra_streams.end(), s) == b->extra_streams.end())
    b->extra_streams.push_back(s);
}

void data_ref::unsafe_free() noexcept {
  if (block_ == nullptr) return;
  freed_ptr_ = block_->ptr;
  freed_bytes_ = block_->requested;
  detail::drop_reference(std::exchange(block_, nullptr), true);
}

}  // namespace refpool
