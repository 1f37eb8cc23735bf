// The resource under a private pool's cache (CUDA graph capture): the framework allocator's
// device resource, except that running out of memory throws at once. A cache retries an
// out-of-memory by freeing its idle blocks and trimming its segments; in a private pool those
// idle bytes are still written by the graphs captured into it, so they must never leave the pool
// before the pool is released (docs/frameworks.md, "CUDA graphs").
#pragma once

#include <memory>
#include <string>

#include <refpool/backend.hpp>
#include <refpool/resource.hpp>
#include <refpool/virtual_memory.hpp>

namespace refpool::detail {

class pool_resource final : public resource {
 public:
  /// Over `upstream` (kept alive); `pool` names the pool in messages.
  pool_resource(backend upstream, std::string pool);

  std::string_view name() const noexcept override { return name_; }
  device_id device() const noexcept override { return upstream_.device(); }
  memory_kind kind() const noexcept override { return upstream_.kind(); }
  std::size_t alignment() const noexcept override { return upstream_.alignment(); }
  /// The upstream's memory, or out_of_memory (never nullptr: no retry may free pool memory).
  void* allocate(std::size_t bytes, stream_ref stream) override;
  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept override {
    upstream_.underlying().deallocate(ptr, bytes, stream);
  }
  void order_streams(stream_ref producer, stream_ref consumer) override {
    upstream_.underlying().order_streams(producer, consumer);
  }
  void synchronize() override { upstream_.underlying().synchronize(); }
  virtual_memory* address_space() noexcept override { return address_space_.get(); }

 private:
  // The upstream's address space, with the same rule for commits.
  class no_retry_address_space;

  backend upstream_;
  std::string name_;
  std::unique_ptr<virtual_memory> address_space_;
};

}  // namespace refpool::detail
