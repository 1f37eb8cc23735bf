#include "framework/pool_resource.hpp"

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "byte_text.hpp"
#include "cache/oom_text.hpp"

namespace refpool::detail {

namespace {
[[noreturn]] void pool_out_of_memory(std::string_view pool, std::size_t bytes, int device) {
  throw out_of_memory(fmt::format("refpool: out of memory: {} could not get {} more {} (a private pool's memory is "
                                  "never reclaimed while graphs may replay into it). What to do: release the pools "
                                  "of graphs no longer replayed (refpool_allocator_release_pool), or call "
                                  "refpool_allocator_empty_cache to free the allocator's idle memory",
                                  pool, scaled_bytes(bytes), memory_place(device)),
                      bytes, device);
}
}  // namespace

class pool_resource::no_retry_address_space final : public virtual_memory {
 public:
  no_retry_address_space(virtual_memory& upstream, const pool_resource& owner) : upstream_(upstream), owner_(owner) {}
  std::size_t granularity() const noexcept override { return upstream_.granularity(); }
  void* reserve(std::size_t bytes) override { return upstream_.reserve(bytes); }
  bool commit(void* addr, std::size_t bytes) override {
    if (!upstream_.commit(addr, bytes)) pool_out_of_memory(owner_.name(), bytes, owner_.device());
    return true;
  }
  void decommit(void* addr, std::size_t bytes) noexcept override { upstream_.decommit(addr, bytes); }
  void release(void* addr, std::size_t bytes) noexcept override { upstream_.release(addr, bytes); }

 private:
  virtual_memory& upstream_;
  const pool_resource& owner_;
};

pool_resource::pool_resource(backend upstream, std::string pool)
    : upstream_(std::move(upstream)), name_(fmt::format("{} ({})", upstream_.name(), pool)) {
  if (virtual_memory* vm = upstream_.underlying().address_space())
    address_space_ = std::make_unique<no_retry_address_space>(*vm, *this);
}

void* pool_resource::allocate(std::size_t bytes, stream_ref stream) {
  void* ptr = upstream_.underlying().allocate(bytes, stream);
  if (ptr == nullptr) pool_out_of_memory(name_, bytes, device());
  return ptr;
}

}  // namespace refpool::detail
