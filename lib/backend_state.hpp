// The shared state behind a `backend` handle: the resource and refpool's counters of it.
// Counted owners: every backend handle, every block allocated from it (live or idle) and every
// plan arena. So a resource lives exactly as long as something can still use or free its memory.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <refpool/resource.hpp>

#include "ref_counted.hpp"

namespace refpool::detail {

/// The units caches round this backend's request sizes up to in their keys, one for each way a
/// cache may serve the backend. The rule that picks them, and which entry is which, belong to the
/// cache's segment source (cache/piece_units.hpp); they are kept here, beside the facts every key
/// copies, so that a request reads its unit in one load.
using key_units = std::array<std::size_t, 3>;

class backend_state : public ref_counted<backend_state> {
 public:
  /// `choose_units` picks the key units from the state's facts, once, at the end of construction.
  backend_state(std::shared_ptr<resource> res, key_units (*choose_units)(const backend_state&));

  [[nodiscard]] resource& res() const noexcept { return *resource_; }
  [[nodiscard]] device_id device() const noexcept { return device_; }
  [[nodiscard]] memory_kind kind() const noexcept { return kind_; }
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] const key_units& units() const noexcept { return units_; }

  // The backend's accounting, changed only here: whole allocations through allocate and
  // deallocate, commits of virtual-memory regions through their vm_region (lib/vm), and the driver
  // calls of plan arenas' regions through the arena source (lib/plan/arena_source.cpp).
  /// resource::allocate with accounting; nullptr means out of memory.
  [[nodiscard]] void* allocate(std::size_t bytes, stream_ref stream);
  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept;
  /// `bytes` of a reservation were committed (decommitted): outstanding like an allocation.
  void count_commit(std::size_t bytes) noexcept { outstanding_.fetch_add(bytes, std::memory_order_relaxed); }
  void count_decommit(std::size_t bytes) noexcept { outstanding_.fetch_sub(bytes, std::memory_order_relaxed); }
  /// A driver call that made (gave back) memory other than through allocate (deallocate).
  void count_allocation_call() noexcept { allocations_.fetch_add(1, std::memory_order_relaxed); }
  void count_deallocation_call() noexcept { deallocations_.fetch_add(1, std::memory_order_relaxed); }

  [[nodiscard]] std::size_t outstanding_bytes() const noexcept { return outstanding_.load(); }
  [[nodiscard]] std::uint64_t allocations() const noexcept { return allocations_.load(); }
  [[nodiscard]] std::uint64_t deallocations() const noexcept { return deallocations_.load(); }

 private:
  friend class ref_counted<backend_state>;
  ~backend_state() = default;

  std::shared_ptr<resource> resource_;
  // Copied out of the resource once: they are part of every cache key.
  device_id device_;
  memory_kind kind_;
  std::size_t alignment_;
  key_units units_{};

  std::atomic<std::size_t> outstanding_{0};
  std::atomic<std::uint64_t> allocations_{0};
  std::atomic<std::uint64_t> deallocations_{0};
};

}  // namespace refpool::detail
