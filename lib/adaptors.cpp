// limiting_resource and failing_resource.
#include <refpool/adaptors.hpp>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool {

limiting_resource::limiting_resource(std::shared_ptr<resource> upstream, std::size_t capacity)
    : upstream_(std::move(upstream)), capacity_(capacity) {
  if (!upstream_) throw invalid_argument("refpool: limiting_resource needs an upstream resource");
  name_ = fmt::format("{} (limit {} B)", upstream_->name(), capacity_);
}

void* limiting_resource::allocate(std::size_t bytes, stream_ref stream) {
  std::size_t used = used_.load();
  do {
    if (bytes > capacity_ || used > capacity_ - bytes) return nullptr;
  } while (!used_.compare_exchange_weak(used, used + bytes));
  void* ptr = upstream_->allocate(bytes, stream);
  if (ptr == nullptr) used_.fetch_sub(bytes);
  return ptr;
}

void limiting_resource::deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept {
  upstream_->deallocate(ptr, bytes, stream);
  used_.fetch_sub(bytes);
}

failing_resource::failing_resource(std::shared_ptr<resource> upstream) : upstream_(std::move(upstream)) {
  if (!upstream_) throw invalid_argument("refpool: failing_resource needs an upstream resource");
  name_ = fmt::format("{} (fault injection)", upstream_->name());
}

void failing_resource::arm(std::uint64_t first, std::uint64_t count, failure how) {
  how_.store(how);
  count_.store(count);
  first_.store(first);
  calls_.store(0);
}

void failing_resource::disarm() { count_.store(0); }

void* failing_resource::allocate(std::size_t bytes, stream_ref stream) {
  const std::uint64_t call = calls_.fetch_add(1) + 1;
  const std::uint64_t first = first_.load();
  if (call >= first && call < first + count_.load()) {
    injected_.fetch_add(1);
    if (how_.load() == failure::backend_error)
      throw backend_error(fmt::format("refpool: injected failure of allocation call {} ({} B)", call, bytes), -1);
    return nullptr;
  }
  return upstream_->allocate(bytes, stream);
}

void failing_resource::deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept {
  upstream_->deallocate(ptr, bytes, stream);
}

}  // namespace refpool
