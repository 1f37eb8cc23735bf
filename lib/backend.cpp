// backend handles and their accounting, and the host backend.
#include <refpool/adaptors.hpp>
#include <refpool/backend.hpp>
#include <refpool/error.hpp>

#include <utility>

#include "backend_state.hpp"
#include "segments/segment_options.hpp"

namespace refpool {

namespace detail {

backend_state::backend_state(std::shared_ptr<resource> res)
    : resource_(std::move(res)),
      device_(resource_->device()),
      kind_(resource_->kind()),
      alignment_(resource_->alignment()) {
  // Decided once: the unit is part of every cache key of this backend (docs/design.md, "Segments").
  // The cache's heaps use the default options; the heap's constructor asks the same rule.
  const std::size_t unit = choose_piece_unit(alignment_, segment_heap_options{}).unit;
  const bool segmentable = unit != 0;
  const bool device_vm = kind_ == memory_kind::device && resource_->address_space() != nullptr;
  piece_units_[static_cast<std::size_t>(segment_policy::off)] = 1;
  piece_units_[static_cast<std::size_t>(segment_policy::on)] = segmentable ? unit : 1;
  piece_units_[static_cast<std::size_t>(segment_policy::automatic)] = segmentable && device_vm ? unit : 1;
}

void* backend_state::allocate(std::size_t bytes, stream_ref stream) {
  void* ptr = resource_->allocate(bytes, stream);
  if (ptr != nullptr) {
    outstanding_.fetch_add(bytes, std::memory_order_relaxed);
    allocations_.fetch_add(1, std::memory_order_relaxed);
  }
  return ptr;
}

void backend_state::deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept {
  resource_->deallocate(ptr, bytes, stream);
  outstanding_.fetch_sub(bytes, std::memory_order_relaxed);
  deallocations_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace detail

backend::backend(std::shared_ptr<resource> res) {
  if (!res) throw invalid_argument("refpool: backend made from a null resource");
  state_ = new detail::backend_state(std::move(res));
}

backend::backend(const backend& other) noexcept : state_(other.state_) {
  if (state_ != nullptr) state_->retain();
}

backend& backend::operator=(const backend& other) noexcept {
  backend copy(other);
  return *this = std::move(copy);
}

backend& backend::operator=(backend&& other) noexcept {
  if (this != &other) {
    if (state_ != nullptr) state_->release();
    state_ = std::exchange(other.state_, nullptr);
  }
  return *this;
}

backend::~backend() {
  if (state_ != nullptr) state_->release();
}

std::string_view backend::name() const noexcept { return state_ ? state_->res().name() : "null"; }
device_id backend::device() const noexcept { return state_ ? state_->device() : -1; }
memory_kind backend::kind() const noexcept { return state_ ? state_->kind() : memory_kind::host; }
std::size_t backend::alignment() const noexcept { return state_ ? state_->alignment() : 0; }
std::size_t backend::outstanding_bytes() const noexcept { return state_ ? state_->outstanding_bytes() : 0; }
std::uint64_t backend::allocation_count() const noexcept { return state_ ? state_->allocations() : 0; }
std::uint64_t backend::deallocation_count() const noexcept { return state_ ? state_->deallocations() : 0; }
resource& backend::underlying() const noexcept { return state_->res(); }

backend host_backend() {
  // Never destroyed: static destructors may still ask for it (made after them, it would go first).
  static const backend& shared = *new backend(make_host_backend());
  return shared;
}

backend make_host_backend() { return backend(make_host_resource()); }

}  // namespace refpool
