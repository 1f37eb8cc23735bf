// Fault injection (fault_injection.hpp): fault_schedule, failing_resource and failing_virtual_memory.
#include "fault_injection.hpp"

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool {

void fault_schedule::arm(std::uint64_t first, std::uint64_t count, failure how) {
  arm_only(all_calls, first, count, how);
}

bool fault_schedule::next(failure& how) noexcept { return next(all_calls, how); }

void fault_schedule::arm_only(unsigned kinds, std::uint64_t first, std::uint64_t count, failure how) {
  kinds_.store(kinds);
  how_.store(how);
  count_.store(count);
  first_.store(first);
  calls_.store(0);
}

bool fault_schedule::next(call_kind kind, failure& how) noexcept {
  if ((kinds_.load() & kind) == 0) return false;
  const std::uint64_t call = calls_.fetch_add(1) + 1;
  const std::uint64_t first = first_.load();
  if (call < first || call - first >= count_.load()) return false;  // no overflow for a count of UINT64_MAX
  injected_.fetch_add(1);
  how = how_.load();
  return true;
}

failing_virtual_memory::failing_virtual_memory(virtual_memory& upstream, std::shared_ptr<fault_schedule> schedule)
    : upstream_(upstream), schedule_(std::move(schedule)) {
  if (!schedule_) throw invalid_argument("refpool: failing_virtual_memory needs a fault schedule");
}

void* failing_virtual_memory::reserve(std::size_t bytes) {
  fault_schedule::failure how{};
  if (schedule_->next(fault_schedule::reservations, how)) {
    if (how == fault_schedule::failure::backend_error)
      throw backend_error(fmt::format("refpool: injected failure of a reservation ({} B)", bytes), -1);
    return nullptr;
  }
  return upstream_.reserve(bytes);
}

bool failing_virtual_memory::commit(void* addr, std::size_t bytes) {
  fault_schedule::failure how{};
  if (schedule_->next(fault_schedule::commits, how)) {
    if (how == fault_schedule::failure::backend_error)
      throw backend_error(fmt::format("refpool: injected failure of a commit ({} B at {})", bytes, addr), -1);
    return false;
  }
  return upstream_.commit(addr, bytes);
}

failing_resource::failing_resource(std::shared_ptr<resource> upstream)
    : resource_adaptor(std::move(upstream), "failing_resource"), schedule_(std::make_shared<fault_schedule>()) {
  if (virtual_memory* vm = upstream_->address_space())
    address_space_ = std::make_unique<failing_virtual_memory>(*vm, schedule_);
  name_ = fmt::format("{} (fault injection)", upstream_->name());
}

void* failing_resource::allocate(std::size_t bytes, stream_ref stream) {
  failure how{};
  if (schedule_->next(fault_schedule::allocations, how)) {
    if (how == failure::backend_error)
      throw backend_error(fmt::format("refpool: injected failure of allocation call {} ({} B)", calls(), bytes), -1);
    return nullptr;
  }
  return upstream_->allocate(bytes, stream);
}

void failing_resource::deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept {
  upstream_->deallocate(ptr, bytes, stream);
}

}  // namespace refpool
