// Arena memory: one allocation, or a reservation of address space committed as plans need more.
#include "plan/arena.hpp"

#include <algorithm>

#include <refpool/resource.hpp>
#include <refpool/virtual_memory.hpp>

#include "cache/cache_state.hpp"
#include "plan/checked_size.hpp"

namespace refpool::detail {

namespace {
// Address space reserved for an arena that grows in place: room for it to grow fourfold, and at
// least 1 GiB (address space is cheap; committed memory is what counts).
constexpr std::size_t reservation_factor = 4;
constexpr std::size_t minimum_reservation = std::size_t{1} << 30;
// Committed memory comes in granules (2 MiB on CUDA and the host): an arena uses virtual memory
// only from 16 granules on, where rounding up to one costs at most 1/16.
constexpr std::size_t minimum_granules = 16;
}  // namespace

arena::arena(backend_state& backend, stream_ref stream) : backend_(&backend), stream_(stream) { backend.retain(); }

arena::~arena() {
  free_memory();
  if (counted_in_ != nullptr) counted_in_->release();
  backend_->release();
}

void arena::count(std::size_t bytes, cache_state& cache) noexcept {
  if (counted_in_ == nullptr) {
    counted_in_ = &cache.reserved();
    counted_in_->retain();
  }
  counted_in_->add(bytes);
}

bool arena::allocate(std::size_t bytes, cache_state& cache) {
  virtual_memory* vm = backend_->res().address_space();
  if (vm != nullptr && bytes / vm->granularity() >= minimum_granules) {
    const std::size_t granule = vm->granularity();
    const std::size_t target = checked_round_up(bytes, granule, "an arena");
    std::size_t reservation = 0;
    if (__builtin_mul_overflow(target, reservation_factor, &reservation)) reservation = target;
    reservation = std::max(reservation, checked_round_up(minimum_reservation, granule, "an arena reservation"));
    region_ = vm_region::reserve(*backend_, *vm, reservation);
    if (region_) {
      base_ = reinterpret_cast<std::byte*>(region_.base());
      bool committed = false;
      try {
        committed = commit_more(target, cache);
      } catch (...) {
        drop_region();  // nothing committed: the reservation goes, and the arena holds nothing
        throw;
      }
      if (!committed) drop_region();
      return committed;
    }
    // No address space left: one allocation, as backends without virtual memory get.
  }
  std::size_t freed = 0;
  void* at = cache.retry_once(*backend_, freed, [&] { return backend_->allocate(bytes, stream_); });
  if (at == nullptr) return false;
  base_ = static_cast<std::byte*>(at);
  committed_.store(bytes, std::memory_order_relaxed);
  count(bytes, cache);
  return true;
}

void arena::drop_region() noexcept {
  region_.release();
  base_ = nullptr;
}

bool arena::commit_more(std::size_t bytes, cache_state& cache) {
  const std::size_t from = committed_.load(std::memory_order_relaxed);
  const std::size_t delta = bytes - from;
  std::size_t freed = 0;
  if (!cache.retry_once(*backend_, freed, [&] { return region_.commit(from, delta); })) return false;
  committed_.store(bytes, std::memory_order_relaxed);
  count(delta, cache);
  // Counted like an allocation: it cost a driver call (the region counts the outstanding bytes).
  backend_->count_allocation_call();
  return true;
}

bool arena::grow_in_place(std::size_t bytes, cache_state& cache) {
  if (!region_) return false;
  const std::size_t target = checked_round_up(bytes, region_.granularity(), "an arena");
  if (target <= committed_.load(std::memory_order_relaxed)) return true;
  if (target > region_.reserved()) return false;
  return commit_more(target, cache);
}

void arena::free_memory() noexcept {
  retire();
  if (base_ == nullptr) return;
  const std::size_t committed = committed_.load(std::memory_order_relaxed);
  if (region_) {
    drop_region();  // decommits what was committed (never 0 bytes) and releases the reservation
    backend_->count_deallocation_call();
  } else {
    backend_->deallocate(base_, committed, stream_);
  }
  if (counted_in_ != nullptr) counted_in_->remove(committed);
  base_ = nullptr;
  committed_.store(0, std::memory_order_relaxed);
}

bool arena::claim(const void* run, const void* key) noexcept {
  if (retired()) return false;
  const void* none = nullptr;
  if (!claimed_by_.compare_exchange_strong(none, run, std::memory_order_acquire, std::memory_order_relaxed))
    return false;
  if (retired()) {  // retired while we claimed: give it back
    unclaim();
    return false;
  }
  claimed_key_.store(key, std::memory_order_relaxed);
  return true;
}

void arena::add_waits(const std::vector<stream_ref>& streams) {
  std::lock_guard guard(waits_lock_);
  for (stream_ref s : streams)
    if (s != stream_ && std::find(waits_.begin(), waits_.end(), s) == waits_.end()) waits_.push_back(s);
  waits_pending_.store(!waits_.empty(), std::memory_order_release);
}

void arena::wait_for_pending(stream_ref consumer) {
  std::lock_guard guard(waits_lock_);
  for (auto it = waits_.begin(); it != waits_.end(); it = waits_.erase(it))
    if (*it != consumer) backend_->res().order_streams(*it, consumer);
  waits_pending_.store(false, std::memory_order_release);
}

}  // namespace refpool::detail
