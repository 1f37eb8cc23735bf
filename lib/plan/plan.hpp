// A plan: a recorded sequence of requests, placed in an arena, with one region (a block) per
// request that runs hand out again and again. A region is handed out only when no live region can
// reach its bytes: each region's state (free, or live in run g) is checked, never trusted from the
// recording (docs/design.md, "Planned scopes").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <refpool/backend.hpp>

#include "access.hpp"
#include "cache/block_key.hpp"
#include "cache/region_block.hpp"
#include "plan/arena.hpp"
#include "plan/placement.hpp"
#include "ref_counted.hpp"

namespace refpool::detail {

class cache_state;

/// One request of a run, as plans match it.
struct planned_request {
  block_key key;  ///< backend, device, kind, alignment, exact bytes
  stream_ref stream;
  friend bool operator==(const planned_request&, const planned_request&) = default;
};

/// A counted handle of the backend `requests` name (one for all, as in every recording and plan);
/// null when there is none.
inline refpool::backend hold_backend(const std::vector<planned_request>& requests) noexcept {
  if (requests.empty()) return {};
  requests.front().key.backend->retain();
  return access::adopt(const_cast<backend_state*>(requests.front().key.backend));
}

/// A run's requests and their lifetimes, not yet placed: what a plan is made from. A recording
/// of a sequence seen once waits as this (placing it costs time a request, which a sequence that
/// never comes again should not pay).
struct recording {
  std::vector<planned_request> requests;
  std::vector<lifetime> lifetimes;
  /// The backend of its requests (one for all), held: a pending recording outlives its run and
  /// the blocks that held the backend, and becomes a plan with an arena of it later.
  refpool::backend backend;
};

/// The fingerprint (key_policy.hpp) of a sequence of requests: their sizes in order.
std::uint64_t fingerprint_of(const std::vector<planned_request>& requests) noexcept;

/// The bytes every region is aligned to (what every backend's own allocations guarantee).
inline constexpr std::size_t region_alignment = 256;

/// What runs see of one region, kept apart from the region's block so that a run's checks read
/// dense memory. `state` is `generation << 2 | flags`: the run that handed the region out last,
/// whether it is live, and whether it holds a reference to its plan (a region still live when its
/// run ended: it keeps the plan alive).
struct region_state {
  static constexpr std::uint64_t live = 1;
  static constexpr std::uint64_t holds_plan = 2;
  static constexpr std::uint64_t live_in(std::uint64_t generation) noexcept { return generation << 2 | live; }
  static constexpr std::uint64_t generation_of(std::uint64_t state) noexcept { return state >> 2; }

  std::atomic<std::uint64_t> state{0};
  std::atomic<std::uint64_t> released_at{0};  ///< the arena's position at its last release
};

class plan final : public ref_counted<plan>, public region_owner {
 public:
  /// Places `requests` (all of one backend and stream) with their recorded lifetimes. Unsafe
  /// frees of its regions are counted by `cache` (retained). Not yet bound to an arena.
  plan(cache_state& cache, std::vector<planned_request> requests, const std::vector<lifetime>& lifetimes);
  /// The same placement for arena `a` (a copy made when an arena is replaced).
  plan(const plan& other, arena& a);
  plan& operator=(const plan&) = delete;

  /// Binds the plan to `a` (retained): its regions, which `a`'s source makes, point into it.
  /// Once, before it is shared.
  void bind(arena& a);
  /// Its arena's span is at `base` now (null: none yet): every region points into it. Caller holds
  /// the arena's pinned_mutex; no region is live.
  void rebase(std::byte* base) noexcept;

  [[nodiscard]] std::size_t size() const noexcept { return requests_.size(); }
  [[nodiscard]] const std::vector<planned_request>& requests() const noexcept { return requests_; }
  [[nodiscard]] const planned_request& request(std::size_t i) const noexcept { return requests_[i]; }
  [[nodiscard]] std::size_t bytes_needed() const noexcept { return bytes_needed_; }
  [[nodiscard]] std::size_t peak_live_bytes() const noexcept { return peak_live_bytes_; }
  /// The fingerprint of its sequence (fingerprint_of): what a run that replays it to its end saw.
  [[nodiscard]] std::uint64_t fingerprint() const noexcept { return fingerprint_; }
  [[nodiscard]] arena& memory() const noexcept { return *arena_; }
  [[nodiscard]] std::size_t offset(std::size_t i) const noexcept { return offsets_[i]; }
  [[nodiscard]] std::size_t span(std::size_t i) const noexcept { return regions_[i].capacity; }
  [[nodiscard]] region_state& state(std::size_t i) const noexcept { return states_[i]; }
  [[nodiscard]] region_block& region_at(std::size_t i) const noexcept { return regions_[i]; }
  /// Requests the recording released just before request `position` (at that position).
  [[nodiscard]] const std::uint32_t* due_begin(std::size_t position) const noexcept {
    return due_.data() + due_start_[position];
  }
  [[nodiscard]] const std::uint32_t* due_end(std::size_t position) const noexcept {
    return due_.data() + due_start_[position + 1];
  }

  /// Bytes of its regions held by handles now (a scan of the region states: for stats).
  [[nodiscard]] std::size_t live_region_bytes() const noexcept override;

  /// The last handle of one of its regions went away (any thread, any time).
  void put_back_region(block* b, bool via_unsafe_free) noexcept override;

 private:
  friend class ref_counted<plan>;
  ~plan();

  cache_state* cache_;  ///< retained: counts unsafe frees of regions
  std::vector<planned_request> requests_;
  /// Held: until the plan is bound, its arena holds nothing of its backend (a recording's went).
  refpool::backend backend_;
  std::vector<std::size_t> offsets_;
  std::vector<std::uint32_t> due_start_;  ///< per position (and one past the last): start in due_
  std::vector<std::uint32_t> due_;        ///< requests by the position of their release
  std::size_t bytes_needed_ = 0;
  std::size_t peak_live_bytes_ = 0;
  std::uint64_t fingerprint_ = 0;
  arena* arena_ = nullptr;
  region_block* regions_ = nullptr;  ///< one per request, from the arena's source
  std::unique_ptr<region_state[]> states_;
};

}  // namespace refpool::detail
