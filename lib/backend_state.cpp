// backend_state: a backend's resource and refpool's accounting of it (the `backend` handle over it
// is in api/backend.cpp).
#include "backend_state.hpp"

#include <utility>

namespace refpool::detail {

backend_state::backend_state(std::shared_ptr<resource> res, key_units (*choose_units)(const backend_state&))
    : resource_(std::move(res)),
      device_(resource_->device()),
      kind_(resource_->kind()),
      alignment_(resource_->alignment()) {
  units_ = choose_units(*this);
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

}  // namespace refpool::detail
