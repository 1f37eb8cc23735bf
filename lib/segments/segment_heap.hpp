// segment_heap: hands out pieces (byte ranges) of segments for one backend, best fit with
// splitting and coalescing, growing segments in place through virtual memory where the backend
// has it. The cache's miss path carves from it; docs/segments.md explains the policy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <refpool/backend.hpp>

#include "free_index.hpp"
#include "piece.hpp"
#include "segment.hpp"
#include "segment_options.hpp"
#include "stream_set.hpp"

namespace refpool::detail {

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
  std::uint64_t splits = 0;  ///< carves that left a free remainder
  std::uint64_t merges = 0;  ///< free neighbours joined by give_back
  std::uint64_t grows = 0;   ///< commits into an existing segment (its tail or a hole)
  std::uint64_t segments_made = 0;
  std::uint64_t segments_released = 0;
  std::uint64_t decommits = 0;      ///< commits given back by trim (whole segments included)
  std::uint64_t plain_frees = 0;    ///< segments without virtual memory given back (one call each)
  std::uint64_t trimmed_bytes = 0;  ///< bytes trim gave back to the backend, in total
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
  /// segment (or makes one). nullopt: out of memory. `growth_step`: a growth commits at least
  /// this much where the hole it commits into has room after the commit's start, at the tail or
  /// inside a segment (bytes a lender gave back to the backend, so that the plain path takes
  /// them in few driver calls; 0: the usual step, at the growable tail only).
  [[nodiscard]] std::optional<carved> carve(std::size_t bytes, stream_ref stream, placement where = placement::anywhere,
                                            std::size_t growth_step = 0);
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
  /// go: whole free segments first (least recently used first), then every commit of a
  /// virtual-memory segment that lies entirely in a free range, wherever it is (least recently
  /// used segment first, highest address first), leaving an uncommitted hole. Returns the
  /// bytes given back. Throws only what resource::order_streams throws, or std::bad_alloc for a
  /// range record, each before changing anything for that segment or range.
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

  // Views and the check for tests: test tooling, defined outside the library
  // (test/support/segment_check.cpp), for white-box tests linked with refpool's objects.

  /// Every range of every segment, in segment order then address order (for tests).
  [[nodiscard]] std::vector<range_view> ranges() const;
  /// Every commit of every segment as (address, bytes), in segment order then address order;
  /// a backend allocation counts as one (for tests).
  [[nodiscard]] std::vector<std::pair<std::uintptr_t, std::size_t>> commits() const;
  /// Checks every invariant (commits inside their reservation and apart, ranges tile exactly
  /// the committed bytes, no two free ranges touch, the free indexes hold exactly the free
  /// ranges, counters match, and after a trim that could give back no more, no free segment and
  /// no free whole commit); throws std::logic_error naming the first violation. For tests.
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
  [[nodiscard]] std::optional<std::size_t> offset_in(const range& r, std::size_t bytes, placement where) const noexcept;
  carved take(pool_state& pool, fit f, std::size_t bytes, stream_ref stream) noexcept;
  void prepare_carve(pool_state& pool);

  // Growth (segment_growth.cpp): a free range (in the index) able to hold `bytes`, or null
  // when the backend is out of memory.
  range* grow(pool_state& pool, pool_id id, std::size_t bytes, placement where, stream_ref stream,
              std::size_t growth_step);
  struct vm_growth {
    range* grown = nullptr;         ///< null: out of memory, or no address space (below)
    bool no_address_space = false;  ///< the reservation was refused
  };
  vm_growth new_vm_segment(pool_state& pool, pool_id id, std::size_t reserve, std::size_t commit, bool growable);
  range* new_growable_segment(pool_state& pool, pool_id id, std::size_t bytes, stream_ref stream);
  /// options_.reserve_bytes in whole granules of vm_ (which is set): what a growable segment
  /// reserves until the backend refuses it.
  [[nodiscard]] std::size_t full_reservation() const noexcept;
  range* new_plain_segment(pool_state& pool, pool_id id, std::size_t bytes, stream_ref stream);
  range* adopt(pool_state& pool, pool_id id, std::unique_ptr<segment> seg, std::unique_ptr<range> whole) noexcept;

  // Holes (segment_holes.cpp): uncommitted address space of a virtual-memory segment between
  // commits or after the last one, with the ranges around it.
  struct hole {
    segment* seg;
    std::size_t start, end;    ///< offsets from the segment's base
    range* prev;               ///< the range ending at `start` (any state), or null
    range* next;               ///< the range starting at `end` (any state), or null
    std::size_t commit_at;     ///< where the request's commit would go (an offset)
    std::size_t commit_bytes;  ///< what the request needs committed there
    bool growable_tail;        ///< the tail of the pool's growable segment: it grows by steps
  };
  [[nodiscard]] std::optional<hole> best_hole(pool_id id, std::size_t bytes, placement where) const;
  void consider_holes(const segment& seg, std::size_t bytes, placement where, std::optional<hole>& best) const;
  range* fill_hole(pool_state& pool, const hole& h, std::size_t growth_step);

  // Trim (segment_trim.cpp).
  std::size_t release_segment(segment& seg);
  std::size_t decommit_free_commits(std::size_t keep_bytes);
  std::size_t decommit_inside(range& r, std::size_t keep_bytes);
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
  /// Address space a new growable segment reserves: full_reservation(), halved each time the
  /// backend refuses it, and back to full_reservation() once trim releases a reservation (docs/
  /// design.md, "Virtual memory failure rules").
  std::size_t reservation_ = 0;
  /// The last trim could give back no more, and no piece came back since: no segment is free and
  /// no commit lies entirely in a free range (check() verifies it).
  bool fully_trimmed_ = false;
  segment_heap_stats counts_;  ///< the event counters (carves .. trimmed_bytes)
};

}  // namespace refpool::detail
