// backend handles (over backend_state, backend_state.cpp) and the host backend.
#include <refpool/adaptors.hpp>
#include <refpool/backend.hpp>
#include <refpool/error.hpp>

#include <utility>

#include "backend_state.hpp"
#include "cache/piece_units.hpp"

namespace refpool {

backend::backend(std::shared_ptr<resource> res) {
  if (!res) throw invalid_argument("refpool: backend made from a null resource");
  state_ = new detail::backend_state(std::move(res), detail::piece_units);
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
