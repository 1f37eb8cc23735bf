// Host virtual memory: address space reserved with mmap(PROT_NONE), committed with mprotect,
// decommitted with madvise(MADV_DONTNEED) + mprotect(PROT_NONE), released with munmap. The
// host backend offers it through resource::address_space(), so segment growth, splitting and
// coalescing are tested in CI without a GPU.
#pragma once

#include <cstddef>

#include <refpool/virtual_memory.hpp>

namespace refpool::detail {

/// Commit unit of host virtual memory: 2 MiB, not the 4 KiB page. It is the granularity
/// cuMemGetAllocationGranularity reports on current NVIDIA GPUs (and HIP's on AMD ones), so
/// host tests run the same rounding as the GPU: a 4 KiB piece still commits a whole granule, a
/// 3 MiB request commits 4 MiB. Committing more than a page costs nothing on the host: mprotect
/// makes pages accessible and the kernel backs them only when they are first touched.
inline constexpr std::size_t host_vm_granularity = std::size_t{2} << 20;

/// Thread-safe (every call is one or two system calls on disjoint ranges). Reserved ranges start
/// at a multiple of the granularity, like the GPU's, so offsets and addresses round alike.
class host_virtual_memory final : public virtual_memory {
 public:
  [[nodiscard]] std::size_t granularity() const noexcept override { return host_vm_granularity; }
  /// mmap(PROT_NONE, MAP_NORESERVE): no memory and no commit charge until commit().
  /// nullptr when the kernel has no address space left (ENOMEM).
  [[nodiscard]] void* reserve(std::size_t bytes) override;
  /// mprotect(PROT_READ | PROT_WRITE). False on ENOMEM (strict overcommit accounting, or the
  /// map count limit); throws `backend_error` on any other errno or a misaligned range.
  [[nodiscard]] bool commit(void* addr, std::size_t bytes) override;
  /// madvise(MADV_DONTNEED) drops the pages (and their contents), mprotect(PROT_NONE) drops the
  /// commit charge. A failure here means the range was never reserved: refpool aborts with a
  /// message rather than carry on with its accounting wrong.
  void decommit(void* addr, std::size_t bytes) noexcept override;
  /// munmap; aborts with a message on failure, as decommit does.
  void release(void* addr, std::size_t bytes) noexcept override;
};

}  // namespace refpool::detail
