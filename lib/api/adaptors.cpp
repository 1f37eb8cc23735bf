// limiting_resource and limiting_virtual_memory, the byte budget they share, and resource_adaptor.
#include <refpool/adaptors.hpp>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool {

bool byte_budget::take(std::size_t bytes) noexcept {
  const std::size_t capacity = capacity_.load();
  std::size_t used = used_.load();
  do {
    if (bytes > capacity || used > capacity - bytes) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes));
  return true;
}

limiting_virtual_memory::limiting_virtual_memory(virtual_memory& upstream, std::shared_ptr<byte_budget> budget)
    : upstream_(upstream), budget_(std::move(budget)) {
  if (!budget_) throw invalid_argument("refpool: limiting_virtual_memory needs a byte budget");
}

bool limiting_virtual_memory::commit(void* addr, std::size_t bytes) {
  if (!budget_->take(bytes)) return false;
  bool committed = false;
  try {
    committed = upstream_.commit(addr, bytes);
  } catch (...) {
    budget_->give_back(bytes);
    throw;
  }
  if (!committed) budget_->give_back(bytes);
  return committed;
}

void limiting_virtual_memory::decommit(void* addr, std::size_t bytes) noexcept {
  upstream_.decommit(addr, bytes);
  budget_->give_back(bytes);
}

resource_adaptor::resource_adaptor(std::shared_ptr<resource> upstream, std::string_view adaptor)
    : upstream_(std::move(upstream)) {
  if (!upstream_) throw invalid_argument(fmt::format("refpool: {} needs an upstream resource", adaptor));
}

limiting_resource::limiting_resource(std::shared_ptr<resource> upstream, std::size_t capacity)
    : limiting_resource(std::move(upstream), std::make_shared<byte_budget>(capacity)) {
  name_ = fmt::format("{} (limit {} B)", upstream_->name(), capacity);
}

limiting_resource::limiting_resource(std::shared_ptr<resource> upstream, std::shared_ptr<byte_budget> budget)
    : resource_adaptor(std::move(upstream), "limiting_resource"), budget_(std::move(budget)) {
  if (!budget_) throw invalid_argument("refpool: limiting_resource needs a byte budget");
  if (virtual_memory* vm = upstream_->address_space())
    address_space_ = std::make_unique<limiting_virtual_memory>(*vm, budget_);
  name_ = fmt::format("{} (limited)", upstream_->name());  // the capacity may change
}

void* limiting_resource::allocate(std::size_t bytes, stream_ref stream) {
  if (!budget_->take(bytes)) return nullptr;
  void* ptr = nullptr;
  try {
    ptr = upstream_->allocate(bytes, stream);
  } catch (...) {
    budget_->give_back(bytes);
    throw;
  }
  if (ptr == nullptr) budget_->give_back(bytes);
  return ptr;
}

void limiting_resource::deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept {
  upstream_->deallocate(ptr, bytes, stream);
  budget_->give_back(bytes);
}

}  // namespace refpool
