// Arena memory: one allocation, or a reservation of address space committed as plans need more;
// and the region blocks of the plans placed in it.
#include "plan/arena_source.hpp"

#include <algorithm>
#include <memory>

#include <refpool/resource.hpp>
#include <refpool/virtual_memory.hpp>

#include "cache/cache_state.hpp"
#include "cache/region_block.hpp"
#include "plan/checked_size.hpp"
#include "plan/plan.hpp"

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

arena_source::arena_source(cache_state& cache) : cache_(cache), reserved_(cache.reserved()) { reserved_.retain(); }

arena_source::~arena_source() { reserved_.release(); }

void arena_source::charge(std::size_t bytes) noexcept {
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  reserved_.add(bytes);
}

void arena_source::uncharge(std::size_t bytes) noexcept {
  bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  reserved_.remove(bytes);
}

// ---- memory -------------------------------------------------------------------------------

bool arena_source::allocate(arena_memory& m, std::size_t bytes) {
  backend_state& backend = *m.backend;
  virtual_memory* vm = backend.res().address_space();
  if (vm != nullptr && bytes / vm->granularity() >= minimum_granules) {
    const std::size_t granule = vm->granularity();
    const std::size_t target = checked_round_up(bytes, granule, "an arena");
    std::size_t reservation = 0;
    if (__builtin_mul_overflow(target, reservation_factor, &reservation)) reservation = target;
    reservation = std::max(reservation, checked_round_up(minimum_reservation, granule, "an arena reservation"));
    m.region = vm_region::reserve(backend, *vm, reservation);
    if (m.region) {
      // Committed at the first run that claims it (recommit), after the plain path's idle memory
      // left: the recording run's escapes (gradients) are released by then, so the arena does
      // not join them at the peak (H200, GPT-2 with 13 lengths: 2 GB of them pinned segments).
      m.base = reinterpret_cast<std::byte*>(m.region.base());
      m.decommitted.store(target, std::memory_order_relaxed);
      return true;
    }
    // No address space left: one allocation, as backends without virtual memory get.
  }
  std::size_t freed = 0;
  void* at = cache_.retry_once(backend, freed, [&] { return backend.allocate(bytes, m.stream); });
  if (at == nullptr) return false;
  m.base = static_cast<std::byte*>(at);
  m.committed.store(bytes, std::memory_order_relaxed);
  charge(bytes);
  return true;
}

void arena_source::drop_region(arena_memory& m) noexcept {
  m.region.release();
  m.base = nullptr;
}

bool arena_source::commit_more(arena_memory& m, std::size_t bytes) {
  const std::size_t from = m.committed.load(std::memory_order_relaxed);
  const std::size_t delta = bytes - from;
  std::size_t freed = 0;
  if (!cache_.retry_once(*m.backend, freed, [&] { return m.region.commit(from, delta); })) return false;
  m.committed.store(bytes, std::memory_order_relaxed);
  charge(delta);
  // Counted like an allocation: it cost a driver call (the region counts the outstanding bytes).
  m.backend->count_allocation_call();
  return true;
}

growth_in_place arena_source::grow_in_place(arena_memory& m, std::size_t bytes) {
  if (bytes <= capacity(m)) return growth_in_place::fits;
  if (!m.region) return growth_in_place::cannot;
  const std::size_t target = checked_round_up(bytes, m.region.granularity(), "an arena");
  if (target > m.region.reserved()) return growth_in_place::cannot;
  if (target <= capacity(m)) return growth_in_place::fits;
  if (m.decommitted.load(std::memory_order_relaxed) != 0) {  // not committed now (lent, or not claimed yet)
    m.decommitted.store(target, std::memory_order_relaxed);  // all of it at recommit
    return growth_in_place::grown;
  }
  return commit_more(m, target) ? growth_in_place::grown : growth_in_place::cannot;
}

void arena_source::free(arena_memory& m) noexcept {
  if (m.base == nullptr) return;
  const std::size_t committed = m.committed.load(std::memory_order_relaxed);
  if (m.region) {
    drop_region(m);  // decommits what was committed and releases the reservation
    if (committed != 0) m.backend->count_deallocation_call();  // a decommitted arena counted its calls
  } else {
    m.backend->deallocate(m.base, committed, m.stream);
  }
  uncharge(committed);
  m.base = nullptr;
  m.committed.store(0, std::memory_order_relaxed);
  m.decommitted.store(0, std::memory_order_relaxed);
}

void arena_source::decommit(arena_memory& m) noexcept {
  const std::size_t committed = m.committed.load(std::memory_order_relaxed);
  if (!m.region || committed == 0) return;
  for (std::size_t i = m.region.commits().size(); i-- > 0;) {
    m.region.decommit(i);
    m.backend->count_deallocation_call();
  }
  m.decommitted.store(committed, std::memory_order_relaxed);  // first: capacity() never reads 0 meanwhile
  m.committed.store(0, std::memory_order_relaxed);
  uncharge(committed);
}

bool arena_source::recommit(arena_memory& m) {
  const std::size_t target = m.decommitted.load(std::memory_order_relaxed);
  if (target == 0) return true;
  if (!commit_more(m, target)) return false;
  m.decommitted.store(0, std::memory_order_relaxed);
  return true;
}

// ---- region blocks ------------------------------------------------------------------------

region_block* arena_source::make_regions(region_owner& owner, const arena_memory& m,
                                         const std::vector<planned_request>& requests,
                                         const std::vector<std::size_t>& offsets) {
  const std::size_t n = requests.size();
  auto made = std::make_unique<region_block[]>(n);
  for (std::size_t i = 0; i < n; ++i) {
    region_block& r = made[i];
    r.ptr = m.base + offsets[i];
    r.capacity = checked_round_up(requests[i].key.bytes, region_alignment, "a planned region");
    r.requested = requests[i].key.bytes;
    r.backend = m.backend;
    r.origin = block_origin::region;
    r.owner = &owner;
    r.region_index = static_cast<std::uint32_t>(i);
    r.last_stream = requests[i].stream;
  }
  std::lock_guard guard(owners_mutex_);
  owners_.push_back(&owner);
  return made.release();
}

void arena_source::take_back_regions(const region_owner& owner, region_block* regions) noexcept {
  {
    std::lock_guard guard(owners_mutex_);
    std::erase(owners_, &owner);
  }
  delete[] regions;
}

std::size_t arena_source::live_region_bytes() const noexcept {
  std::lock_guard guard(owners_mutex_);
  std::size_t bytes = 0;
  for (const region_owner* o : owners_) bytes += o->live_region_bytes();
  return bytes;
}

}  // namespace refpool::detail
