// vm_region: one reserved address range of a backend's virtual memory and the commits in it.
// Plan arenas and segment heaps both reserve, commit, decommit and release through it, so the
// failure rules of docs/design.md ("Virtual memory failure rules") and the accounting of
// committed bytes (the backend's outstanding bytes) are written once, here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace refpool {
class virtual_memory;
}

namespace refpool::detail {

class backend_state;

/// Owns one reservation and its commits; decommits and releases them when destroyed.
///
/// Commits need not be contiguous: a range may have uncommitted holes (a segment heap decommits
/// free commits anywhere). Each commit is one `virtual_memory::commit` call, i.e. one physical
/// allocation, and is decommitted whole, as a GPU unmaps whole mappings.
///
/// Failure rules: a refused reservation is an empty region (the caller falls back); a refused
/// commit returns false with nothing committed (out of memory); anything thrown (`backend_error`,
/// std::bad_alloc) leaves the region as it was. Decommit and release cannot fail (the
/// `virtual_memory` contract). Not thread-safe: its owner serialises every call.
class vm_region {
 public:
  /// One commit: bytes [offset, offset + bytes) from the region's base.
  struct commit_record {
    std::size_t offset;
    std::size_t bytes;
    [[nodiscard]] std::size_t end() const noexcept { return offset + bytes; }
  };

  vm_region() noexcept = default;  ///< empty: reserves nothing
  /// Reserves `bytes` (a positive multiple of `vm`'s granularity) of `vm`, which is `backend`'s
  /// address space. Empty when no address space is left (reserve returned nullptr). Throws what
  /// reserve throws, and `backend_error` (after releasing it) for a range that does not start at
  /// a multiple of the granularity. `backend` must outlive the region (its owner keeps it).
  static vm_region reserve(backend_state& backend, virtual_memory& vm, std::size_t bytes);

  vm_region(vm_region&& other) noexcept { *this = static_cast<vm_region&&>(other); }
  vm_region& operator=(vm_region&& other) noexcept;
  vm_region(const vm_region&) = delete;
  vm_region& operator=(const vm_region&) = delete;
  ~vm_region() { free_reservation(); }

  [[nodiscard]] explicit operator bool() const noexcept { return vm_ != nullptr; }
  [[nodiscard]] std::uintptr_t base() const noexcept { return base_; }
  [[nodiscard]] std::size_t reserved() const noexcept { return reserved_; }
  [[nodiscard]] std::size_t committed() const noexcept { return committed_; }
  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  /// The commits, in address order.
  [[nodiscard]] const std::vector<commit_record>& commits() const noexcept { return commits_; }
  /// Index of the first commit that ends after `offset` (commits().size() if none).
  [[nodiscard]] std::size_t first_ending_after(std::size_t offset) const noexcept;

  /// Commits [offset, offset + bytes): granule-aligned, inside the range, and overlapping no
  /// commit (else std::logic_error: a bug in refpool). Counts the bytes as the backend's
  /// outstanding bytes. False, with nothing committed, when the backend is out of memory.
  [[nodiscard]] bool commit(std::size_t offset, std::size_t bytes);
  /// Decommits commit number `index`, whole, and stops counting its bytes.
  void decommit(std::size_t index) noexcept;
  /// Decommits every commit (one call each) and releases the range; the region is empty after.
  void free_reservation() noexcept;
  /// Forgets the range without giving anything back: its memory stays reserved and committed
  /// (for pieces a caller still holds after their heap is gone). The region is empty after.
  void abandon() noexcept;

 private:
  backend_state* backend_ = nullptr;
  virtual_memory* vm_ = nullptr;
  std::uintptr_t base_ = 0;
  std::size_t reserved_ = 0;
  std::size_t committed_ = 0;
  std::size_t granularity_ = 0;
  std::vector<commit_record> commits_;
};

}  // namespace refpool::detail
