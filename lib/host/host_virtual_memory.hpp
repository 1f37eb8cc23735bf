// Host virtual memory: address space reserved with mmap(PROT_NONE), committed with mprotect,
// decommitted by mapping PROT_NONE over the range again, released with munmap. Commits are
// charged to the kernel's commit accounting as plain allocations are, so what malloc would be
// refused a commit is refused too (out of memory), never handed out to be killed for at first
// touch. The host backend offers it through resource::address_space(), so segment growth,
// splitting and coalescing are tested in CI without a GPU.
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
  /// mmap(PROT_NONE) without MAP_NORESERVE: no memory and no commit charge until commit().
  /// nullptr when the kernel has no address space left (ENOMEM, e.g. under `ulimit -v`).
  [[nodiscard]] void* reserve(std::size_t bytes) override;
  /// mprotect(PROT_READ | PROT_WRITE), which charges the range to the commit accounting as
  /// malloc's mmap is charged. The kernel checks the charge before it changes anything, so a
  /// refusal leaves the range reserved. False on ENOMEM (the overcommit heuristic or strict
  /// accounting refused, RLIMIT_DATA, or the map count limit); throws `backend_error` on any
  /// other errno or a misaligned range. (mmap(MAP_FIXED) over the range would be charged too,
  /// but a refused one unmaps the range first on kernels before 6.12, leaving a hole in the
  /// reservation for any other mapping to take.)
  [[nodiscard]] bool commit(void* addr, std::size_t bytes) override;
  /// mmap(PROT_NONE, MAP_FIXED) over the range: drops the pages (and their contents) and the
  /// commit charge. If the kernel refuses (the map count limit, when the range is part of a
  /// larger mapping), madvise(MADV_DONTNEED) still drops the pages and the charge stays until
  /// the range is committed again or released. A failure of both means the range was never
  /// reserved: refpool aborts with a message rather than carry on with its accounting wrong.
  void decommit(void* addr, std::size_t bytes) noexcept override;
  /// munmap; aborts with a message on failure, as decommit does.
  void release(void* addr, std::size_t bytes) noexcept override;
};

}  // namespace refpool::detail
