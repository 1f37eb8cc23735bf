// data_ref: copies, access checks, unsafe_free, and where a block goes after its last handle.
#include <refpool/data_ref.hpp>
#include <refpool/error.hpp>

#include <algorithm>

#include <fmt/format.h>

#include "alloc_log.hpp"
#include "block.hpp"
#include "cache_state.hpp"
#include "env_config.hpp"
#include "plan.hpp"

namespace refpool {

namespace detail {

void last_reference_dropped(block_header* h, bool via_unsafe_free) noexcept {
  block* b = as_block(h);
  b->refs.store(0, std::memory_order_relaxed);
  if (alloc_log* log = active_log()) log->record(false, b->ptr, b->requested, b->last_stream);
  if (plan_run* run = std::exchange(b->run, nullptr)) {
    run->on_release(b->run_index, b->home == nullptr, via_unsafe_free && b->home == nullptr && b->region_of == nullptr);
    run->release();
  }
  if (b->region_of != nullptr) {
    b->region_of->release_region(b, via_unsafe_free);
    return;
  }
  if (b->home != nullptr) {
    b->home->owner->cache->release_block(b, via_unsafe_free);
    return;
  }
  b->direct_backend->deallocate(b->ptr, b->capacity, b->last_stream);
  delete b;
}

}  // namespace detail

void data_ref::check_live(const char* what) const {
  if (is_freed())
    throw use_after_free(fmt::format(
        "refpool: use after unsafe_free: {} through a handle whose buffer {} ({} B) it released with "
        "unsafe_free()",
        what, freed_ptr_, freed_bytes_));
}

data_ref::data_ref(const data_ref& other) {
  other.check_live("copy");
  block_ = other.block_;
  if (block_ != nullptr) block_->refs.fetch_add(1, std::memory_order_relaxed);
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

void* data_ref::data() const {
  check_live("data()");
  return block_ == nullptr ? nullptr : detail::as_block(block_)->ptr;
}

std::size_t data_ref::bytes() const {
  check_live("bytes()");
  return block_ == nullptr ? 0 : detail::as_block(block_)->requested;
}

std::size_t data_ref::capacity() const {
  check_live("capacity()");
  return block_ == nullptr ? 0 : detail::as_block(block_)->capacity;
}

long data_ref::use_count() const noexcept {
  return block_ == nullptr ? 0 : static_cast<long>(block_->refs.load(std::memory_order_relaxed));
}

backend data_ref::source() const {
  check_live("source()");
  if (block_ == nullptr) return {};
  const detail::block* b = detail::as_block(block_);
  return backend(b->home != nullptr ? b->home->backend_owner : b->direct_backend);
}

stream_ref data_ref::stream() const {
  check_live("stream()");
  return block_ == nullptr ? stream_ref{} : detail::as_block(block_)->last_stream;
}

void data_ref::record_stream(stream_ref s) const {
  check_live("record_stream()");
  if (block_ == nullptr) return;
  detail::block* b = detail::as_block(block_);
  std::lock_guard guard(b->streams_lock);
  if (s != b->last_stream && std::find(b->extra_streams.begin(), b->extra_streams.end(), s) == b->extra_streams.end())
    b->extra_streams.push_back(s);
}

void data_ref::unsafe_free() noexcept {
  if (block_ == nullptr) return;
  const detail::block* b = detail::as_block(block_);
  freed_ptr_ = b->ptr;
  freed_bytes_ = b->requested;
  detail::drop_reference(std::exchange(block_, nullptr), true);
}

}  // namespace refpool
