// segment_heap: hands out pieces (byte ranges) of segments for one backend, best fit with
// splitting and coalescing, growing segments in place through virtual memory where the backend
// has it. The cache's miss path carves from it; docs/segments.md explains the policy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <refpool/backend.hpp>

#include "free_index.hpp"
#include "piece.hpp"
#include "segment.hpp"
#include "stream_set.hpp"

namespace refpool::detail {

/// Tunables of a segment_heap, with their defaults and reasons (docs/segments.md has the
/// measurements). Every size is in bytes.
struct segment_heap_options {
  /// Pieces are multiples of this (raised to the backend's alignment if that is larger). 512 as
  /// in PyTorch: a 1-byte request costs 512 B, and the unit keeps free ranges few.
  std::size_t piece_granularity = default_piece_unit;
  /// Requests up to this size are small and come from the small pool, so that small pieces,
  /// which often live long (parameters, scalars), never pin a large segment.
  std::size_t small_max = std::size_t{1} << 20;

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
  /// far below the 47-bit address space of a process. Reserving commits no memory.
  std::size_t reserve_bytes = std::size_t{256} << 30;
  /// With virtual memory: requests of at least this size get a segment of their own (one
  /// reservation, one commit), which trim can give back whole; inside the growable segment
  /// only its free tail can be decommitted.
  std::size_t own_segment_min = std::size_t{256} << 20;
  /// With virtual memory: a growable segment grows by at least 1/growth_divisor of what it has
  /// committed (at most max_growth_step), so a heap of N bytes made by small requests costs
  /// O(log N) commits, not N / granularity driver calls (2,400 for 4.8 GB of 1 MiB pieces on
  /// CUDA). Memory held ahead of need stays below 1/growth_divisor of the heap (1.6%).
  std::size_t growth_divisor = 64;
  std::size_t max_growth_step = std::size_t{64} << 20;
};

/// Where a piece may lie with respect to physical allocations (virtual-memory commits).
enum class placement : std::uint8_t {
  /// Anywhere in one segment: with virtual memory the piece may cross the boundary between
  /// two commits, i.e. lie in two or more physical allocations.
  anywhere,
  /// Inside one physical allocation, as IPC export and NCCL/RDMA registration need.
  one_physical_allocation,
};

/// Counters and sizes of a heap. Bytes are exact: used + free = committed.
struct segment_heap_stats {
  std::size_t segments = 0;
  std::size_t reserved_bytes = 0;   ///< address space of all segments
  std::size_t committed_bytes = 0;  ///< memory behind them (backend allocations + commits)
  std::size_t used_bytes = 0;       ///< in pieces handed out
  std::size_t free_bytes = 0;       ///< committed and in no piece
  std::size_t largest_free_bytes = 0;
  std::size_t free_ranges = 0;
  std::size_t pieces_out = 0;
  std::size_t physical_allocations = 0;  ///< backend allocations + live commits
  std::uint64_t carves = 0;
  std::uint64_t splits = 0;          ///< carves that left a free remainder
  std::uint64_t merges = 0;          ///< free neighbours joined by give_back
  std::uint64_t grows = 0;           ///< commits at the end of an existing segment
  std::uint64_t segments_made = 0;
  std::uint64_t segments_released = 0;
  std::uint64_t decommits = 0;       ///< commits given back by trim (whole segments included)
  std::uint64_t trimmed_bytes = 0;   ///< bytes trim gave back to the backend, in total
};

/// One backend's segments and the pieces carved from them.
///
/// Thread safety: none; the caller serialises every call (the cache holds a lock). Calls into
/// the backend (allocate, reserve, commit, deallocate, decommit, release) happen inside carve,
/// trim and release_all, under that lock.
///
/// Errors: carve returns std::nullopt when the backend or its virtual memory says "out of
/// memory" (the caller may give cached pieces back and retry, or trim); a zero size or one
/// whose rounding overflows throws `size_error`; any other backend failure throws
/// `backend_error`. Whatever is thrown or returned, the heap is unchanged by a failed call.
///
/// Streams: a free range remembers the streams that used its bytes (its stream_set; coalescing
/// unites them). carve() returns the streams the requester must be ordered after: each with
/// resource::order_streams, or, when the set is "any", by waiting for the whole device (then
/// forget_streams()).
class segment_heap {
 public:
  /// A piece handed out: `bytes` (the request rounded up to the piece granularity) at
  /// `address`. The caller keeps it and passes it to give_back exactly once.
  using piece = segment_piece;
  struct carved {
    piece p;
    /// Streams that may still use the piece's bytes, without the requesting stream.
    stream_set waits;
  };
  /// A range as tests see it.
  struct range_view {
    std::uintptr_t address;
    std::size_t bytes;
    bool free;
    std::uint64_t segment;
    stream_set streams;
  };

  /// Serves `be` (keeps it alive). Throws `invalid_argument` for a null backend, `config_error` if
  /// the options are unusable.
  explicit segment_heap(backend be, segment_heap_options options = {});
  /// Releases every segment; a piece still out is a caller bug (reported on stderr, asserted,
  /// and its segment left allocated so that its memory stays valid).
  ~segment_heap();
  segment_heap(const segment_heap&) = delete;
  segment_heap& operator=(const segment_heap&) = delete;

  /// A piece of at least `bytes` for use on `stream`: best fit among free ranges, else grows a
  /// segment (or makes one). nullopt: out of memory.
  [[nodiscard]] std::optional<carved> carve(std::size_t bytes, stream_ref stream,
                                            placement where = placement::anywhere);
  /// As carve, from free ranges only: never calls the backend. nullopt: nothing fits.
  [[nodiscard]] std::optional<carved> carve_free(std::size_t bytes, stream_ref stream,
                                                 placement where = placement::anywhere);
  /// The piece becomes free, joined with free neighbours in its segment. `used_on`: every
  /// stream that may still use it (its last stream plus any recorded ones). Returns the size
  /// of the free range it is now part of.
  std::size_t give_back(const piece& p, const stream_set& used_on) noexcept;
  /// True when pieces of `bytes` (a piece size) come from the small pool; pieces of one pool
  /// never coalesce with the other's. Needs no lock: it depends on the options only.
  [[nodiscard]] bool small(std::size_t bytes) const noexcept { return bytes <= options_.small_max; }

  /// Gives memory back to the backend until at most `keep_bytes` are free or nothing more can
  /// go: whole free segments first (least recently used first), then free tails of
  /// virtual-memory segments, one commit at a time. Returns the bytes given back. Throws only
  /// what resource::order_streams throws (before changing anything for that segment).
  std::size_t trim(std::size_t keep_bytes = 0);
  /// Gives every segment back. Throws `invalid_argument` (and changes nothing) if a piece is out.
  void release_all();
  /// Forgets the streams of all free ranges: call after waiting for all work on the device.
  void forget_streams() noexcept;

  /// Rounded size a request of `bytes` gets; throws `size_error` for 0 or on overflow.
  [[nodiscard]] std::size_t piece_bytes(std::size_t bytes) const;
  /// Number of physical allocations the piece lies in (1 unless it crosses commits).
  [[nodiscard]] std::size_t physical_allocations(const piece& p) const noexcept;
  [[nodiscard]] segment_heap_stats stats() const noexcept;
  /// stats().committed_bytes, cheaply.
  [[nodiscard]] std::size_t committed_bytes() const noexcept { return committed_; }
  [[nodiscard]] const backend& source() const noexcept { return backend_; }
  /// True when segments grow through virtual memory.
  [[nodiscard]] bool uses_virtual_memory() const noexcept { return vm_ != nullptr; }
  [[nodiscard]] const segment_heap_options& options() const noexcept { return options_; }

  /// Every range of every segment, in segment order then address order (for tests).
  [[nodiscard]] std::vector<range_view> ranges() const;
  /// Checks every invariant (ranges tile each segment's committed bytes, no two free
  /// neighbours, the free indexes hold exactly the free ranges, counters match); throws
  /// std::logic_error naming the first violation. For tests.
  void check() const;

 private:
  struct pool_state {
    free_index free;
    segment* growable = nullptr;
  };
  struct fit {
    range* r;
    std::size_t offset;  ///< where in r the piece starts
  };

  pool_state& pool_for(std::size_t bytes) noexcept;
  [[nodiscard]] std::optional<fit> find_fit(pool_state& pool, std::size_t bytes, placement where) const noexcept;
  [[nodiscard]] std::optional<std::size_t> offset_in(const range& r, std::size_t bytes,
                                                     placement where) const noexcept;
  carved take(pool_state& pool, fit f, std::size_t bytes, stream_ref stream) noexcept;
  void prepare_carve(pool_state& pool);

  // Growth (segment_growth.cpp): a free range (in the index) able to hold `bytes`, or null
  // when the backend is out of memory.
  struct growth {
    range* grown = nullptr;  ///< null: out of memory, or no room (below)
    bool no_room = false;    ///< the reservation is full
  };
  range* grow(pool_state& pool, pool_id id, std::size_t bytes, placement where, stream_ref stream);
  growth grow_in_place(pool_state& pool, segment& seg, std::size_t bytes, placement where);
  range* new_vm_segment(pool_state& pool, pool_id id, std::size_t reserve, std::size_t commit, bool growable);
  range* new_plain_segment(pool_state& pool, pool_id id, std::size_t bytes, stream_ref stream);
  range* adopt(pool_state& pool, pool_id id, std::unique_ptr<segment> seg, std::unique_ptr<range> whole) noexcept;

  // Trim (segment_trim.cpp).
  std::size_t release_segment(segment& seg);
  std::size_t decommit_last_commit(segment& seg) noexcept;
  void drop_segment(segment& seg) noexcept;

  backend backend_;
  virtual_memory* vm_ = nullptr;
  segment_heap_options options_;
  std::size_t granule_;  ///< piece granularity
  bool host_visible_;    ///< host memory: free bytes are poisoned under ASan
  std::array<pool_state, 2> pools_;
  std::vector<std::unique_ptr<segment>> segments_;
  /// Range records made ahead of a carve (prepare_carve), so that take() cannot fail, and
  /// records give_back freed, kept for the next carves (up to spare_records).
  static constexpr std::size_t spare_records = 16;
  void keep_spare(range* r) noexcept;
  std::vector<std::unique_ptr<range>> spare_ranges_;

  std::uint64_t tick_ = 0;
  std::uint64_t next_segment_id_ = 1;
  std::size_t reserved_ = 0;
  std::size_t committed_ = 0;
  std::size_t used_ = 0;
  std::size_t pieces_out_ = 0;
  std::size_t physical_ = 0;
  segment_heap_stats counts_;  ///< the event counters (carves .. trimmed_bytes)
};

}  // namespace refpool::detail
