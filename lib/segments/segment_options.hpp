// The tunables of a segment heap, and the one rule that decides whether a heap with them can
// serve a backend and with which piece unit: the heap's constructor and the cache's choice of
// keys (backend_state) both ask it, so they cannot disagree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace refpool::detail {

/// The default piece unit: every piece is a multiple of it, at a multiple of it from its
/// segment's base. 512 B as in PyTorch (docs/segments.md, "Size classes").
inline constexpr std::size_t default_piece_unit = 512;

/// Tunables of a segment_heap, with their defaults and reasons (docs/segments.md has the
/// measurements). Every size is in bytes.
struct segment_heap_options {
  /// Pieces are multiples of this (raised to the backend's alignment if that is larger). 512 as
  /// in PyTorch: a 1-byte request costs 512 B, and the unit keeps free ranges few.
  std::size_t piece_granularity = default_piece_unit;
  /// Requests up to this size are small and come from the small pool, so that small pieces,
  /// which often live long (parameters, scalars), never pin a large segment. 256 KiB, not
  /// PyTorch's 1 MiB: each pool peaks on its own and neither can use the other's free bytes, and
  /// GPT-2 serving's activations of 256 KiB to 1 MiB made the small pool's peak an extra 8% of
  /// peak live (1.175x against 1.083x; docs/segments.md, "Size classes").
  std::size_t small_max = std::size_t{256} << 10;

  /// Without virtual memory: size of a small-pool segment (one backend allocation).
  std::size_t small_segment = std::size_t{2} << 20;
  /// Without virtual memory: large requests below half of this share segments of this size;
  /// larger ones get a segment of their size rounded up to `segment_rounding`. (PyTorch's
  /// kLargeBuffer and kMinLargeAlloc.)
  std::size_t large_segment = std::size_t{20} << 20;
  std::size_t segment_rounding = std::size_t{2} << 20;

  /// Grow segments through resource::address_space() when the backend has one.
  bool use_virtual_memory = true;
  /// With virtual memory: address space reserved for a pool's growable segment. 256 GiB is more
  /// than any single GPU has today (H200 141 GB, MI300X 192 GB), so a pool has one segment, and
  /// far below the 47-bit address space of a process. Reserving commits no memory. When the
  /// backend refuses a reservation the heap halves this, down to what the request needs, then
  /// makes backend allocations; the full size is tried again once trim releases a reservation
  /// (docs/design.md, "Virtual memory failure rules").
  std::size_t reserve_bytes = std::size_t{256} << 30;
  /// With virtual memory: requests of at least this size get a segment of their own (one
  /// reservation, one commit), which trim can give back whole. None by default: such a segment
  /// cannot coalesce with the growable one, so a freed huge buffer's bytes serve only what fits
  /// in them and the next huge buffer makes another segment (GPT-2 serving, whose 503 MiB logits
  /// come once a request: 1.298x of peak live with segments of their own from 256 MiB, 1.100x
  /// without; the training traces have no request that large). In the growable segment a huge
  /// piece is its own commit where it extends the tail, and trim decommits that when it is free.
  std::size_t own_segment_min = SIZE_MAX;
  /// With virtual memory: a growable segment grows by at least 1/growth_divisor of what it has
  /// committed (at most max_growth_step), so a heap of N bytes made by small requests costs
  /// O(log N) commits, not N / granularity driver calls (2,400 for 4.8 GB of 1 MiB pieces on
  /// CUDA). Memory held ahead of need stays below 1/growth_divisor of the heap (1.6%).
  std::size_t growth_divisor = 64;
  std::size_t max_growth_step = std::size_t{64} << 20;
};

/// The piece unit of a heap with `options` over a backend aligned to `alignment`, or 0 and the
/// reason when no such heap can be made.
struct piece_unit_choice {
  std::size_t unit = 0;
  std::string problem;
};

/// The unit is the larger of the piece granularity and the alignment. There is none (the
/// backend keeps plain blocks) when either is not a power of two, when the unit is larger than
/// `small_max` (every small request would cost a whole unit: a backend aligned to 4 MiB would
/// give a 4 KiB request 4 MiB), or when the options do not fit it (segment sizes that are not
/// multiples of it, small_max outside [1, small_segment], growth_divisor 0).
[[nodiscard]] piece_unit_choice choose_piece_unit(std::size_t alignment, const segment_heap_options& options);

}  // namespace refpool::detail
