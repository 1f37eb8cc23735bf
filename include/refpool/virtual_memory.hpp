// `virtual_memory`: address space reserved once and backed with memory on demand, so a segment
// can grow in place (cuMemAddressReserve + cuMemCreate/cuMemMap on CUDA, the same calls on HIP,
// mmap(PROT_NONE) + mprotect on the host). A resource that offers it returns one from
// `resource::address_space()`; refpool's segment allocator then grows segments through it.
#pragma once

#include <cstddef>

#include <refpool/detail/export.hpp>

namespace refpool {

/// Reserve/commit primitives of one backend (one device, one memory kind).
///
/// Ranges: `reserve` returns an address range with no memory behind it; `commit` backs a
/// granule-aligned sub-range with memory usable like the backend's own allocations; `decommit`
/// gives that memory back and leaves the range reserved; `release` gives a whole reserved range
/// back (the caller decommits what it committed first).
///
/// Physical pieces: one `commit` call makes one physical allocation behind its range. Memory
/// committed by separate calls is contiguous in addresses but may be separate allocations to
/// the driver (which matters for IPC and RDMA registration: docs/design.md, "Segments").
///
/// Thread safety: implementations must be thread-safe. refpool calls them under the lock of the
/// segment heap or plan arena they grow or shrink, never under a cache's mutex or a slot's
/// lock (see `resource`); they must not call back into refpool.
///
/// Errors: `reserve` returns nullptr when address space runs out, `commit` returns false when
/// the device is out of memory; any other failure throws `backend_error`.
class REFPOOL_API virtual_memory {
 public:
  virtual ~virtual_memory() = default;

  /// Commit unit in bytes (a power of two): commits and decommits are multiples of it, at
  /// multiples of it from the reserved range's start.
  [[nodiscard]] virtual std::size_t granularity() const noexcept = 0;

  /// Reserves `bytes` (a multiple of granularity()) of address space; nullptr if none is left.
  [[nodiscard]] virtual void* reserve(std::size_t bytes) = 0;
  /// Backs [addr, addr + bytes) of a reserved range with memory. False when out of memory.
  [[nodiscard]] virtual bool commit(void* addr, std::size_t bytes) = 0;
  /// Gives the memory behind [addr, addr + bytes) back; the range stays reserved. refpool calls
  /// it for memory no handle reaches any more, but work enqueued on streams may still use it:
  /// an implementation for a device with streams must wait for that work before unmapping
  /// (synchronise the device, as cuMemFree does implicitly and PyTorch does before cuMemUnmap).
  virtual void decommit(void* addr, std::size_t bytes) noexcept = 0;
  /// Gives a reserved range back; nothing in it is committed any more.
  virtual void release(void* addr, std::size_t bytes) noexcept = 0;
};

}  // namespace refpool
