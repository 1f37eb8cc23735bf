// Host backend: pageable memory from the C++ aligned allocator, so ASan and friends see the
// exact bounds of every block; and host virtual memory for segments that grow in place.
#include <cstddef>
#include <limits>
#include <new>

#include <refpool/adaptors.hpp>
#include <refpool/backend.hpp>

#include "host_virtual_memory.hpp"

namespace refpool {

namespace {

class host_resource final : public resource {
 public:
  std::string_view name() const noexcept override { return "host"; }
  device_id device() const noexcept override { return -1; }
  memory_kind kind() const noexcept override { return memory_kind::host; }
  std::size_t alignment() const noexcept override { return host_alignment; }

  void* allocate(std::size_t bytes, stream_ref) override {
    // No object is larger than PTRDIFF_MAX. Above it libstdc++'s aligned new may wrap: it rounds
    // the size up to the alignment unchecked, so SIZE_MAX "succeeded" as a 0-byte allocation.
    if (bytes > static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max())) return nullptr;
    return ::operator new (bytes, std::align_val_t{host_alignment}, std::nothrow);
  }
  void deallocate(void* ptr, std::size_t, stream_ref) noexcept override {
    ::operator delete (ptr, std::align_val_t{host_alignment});
  }
  virtual_memory* address_space() noexcept override { return &address_space_; }

 private:
  detail::host_virtual_memory address_space_;
};

}  // namespace

std::shared_ptr<resource> make_host_resource() { return std::make_shared<host_resource>(); }

}  // namespace refpool
