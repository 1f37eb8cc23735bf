// A resource for tests that passes every call to a host resource of its own: a test derives from
// it and overrides only what it watches or changes (name, stream ordering, address space...).
#pragma once

#include <memory>
#include <string_view>

#include <refpool/adaptors.hpp>

namespace refpool::test {

class forwarding_resource : public resource_adaptor {
 public:
  forwarding_resource() : resource_adaptor(make_host_resource(), "forwarding_resource") {}

  std::string_view name() const noexcept override { return "host (forwarded)"; }
  void* allocate(std::size_t bytes, stream_ref stream) override { return upstream_->allocate(bytes, stream); }
  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept override {
    upstream_->deallocate(ptr, bytes, stream);
  }
};

}  // namespace refpool::test
