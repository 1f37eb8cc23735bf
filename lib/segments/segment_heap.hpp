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
#include "heap_counts.hpp"
#include "piece.hpp"
#include "segment.hpp"
#include "segment_layout.hpp"
#include "segment_options.hpp"
#include "span.hpp"
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

/// One backend's segments and the pieces carved from them.
///
/// Thread safety: none; the caller serialises every call (the cache holds a lock). Calls into
/// the backend (allocate, reserve, commit, deallocate, decommit, release) happen inside carve,
/// trim and free_all, under that lock.
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
  /// Frees every segment to the backend; a piece still out is a caller bug (reported on stderr, asserted,
  /// and its segment left allocated so that its memory stays valid).
  ~segment_heap();
  segment_heap(const segment_heap&) = delete;
  segment_heap& operator=(const segment_heap&) = delete;

  /// A piece of at least `bytes` for use on `stream`: best fit among free ranges, else the bytes
  /// of idle spans of its pool (yielded, least recently idle first), else grows a segment (or
  /// makes one). nullopt: out of memory.
  [[nodiscard]] std::optional<carved> carve(std::size_t bytes, stream_ref stream,
                                            placement where = placement::anywhere);
  /// As carve, from free ranges only: never calls the backend, never yields a span. nullopt:
  /// nothing fits.
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
  /// Frees every segment to the backend. Throws `invalid_argument` (and changes nothing) if a piece or a span is out.
  void free_all();
  /// Forgets the streams of all free ranges and idle spans: call after waiting for all work on the device.
  void forget_streams() noexcept;

  /// Rounded size a request of `bytes` gets; throws `size_error` for 0 or on overflow.
  [[nodiscard]] std::size_t piece_bytes(std::size_t bytes) const;
  /// Number of physical allocations the piece lies in (1 unless it crosses commits).
  [[nodiscard]] std::size_t physical_allocations(const piece& p) const noexcept;
  [[nodiscard]] segment_heap_stats stats() const noexcept;
  /// stats().committed_bytes, cheaply.
  [[nodiscard]] std::size_t committed_bytes() const noexcept { return totals_.committed; }
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
  // ---- spans (segment_spans.cpp; span.hpp and docs/segments.md, "One memory space") ------------
  struct span_carved {
    segment_span* span;
    /// Streams that may still use its bytes, without the requesting stream.
    stream_set waits;
  };
  /// A new span of at least `bytes` for `stream`, held: placed as carve places a piece (best fit,
  /// then idle spans of the pool yielded, then growth in the upper half of a virtual-memory
  /// reservation, span_floor). nullopt: out of memory. Throws as carve. The record is the caller's
  /// to use until give_back_span.
  [[nodiscard]] std::optional<span_carved> carve_span(std::size_t bytes, stream_ref stream);
  /// The owner of held span `s` uses none of its bytes now (held -> idle): the heap may yield it
  /// when a pool would grow, or at yield_idle_spans. `used_on`: every stream that may still use them.
  void idle_span(segment_span& s, const stream_set& used_on) noexcept;
  /// The owner uses `s` again (idle or yielded -> held; held stays held). A yielded span is placed
  /// again: at its home address when the bytes there are free or uncommitted (the holes are
  /// committed), else as carve_span places one (`moved`: a new address). nullopt: out of memory,
  /// and it stays yielded. Throws as carve.
  [[nodiscard]] std::optional<span_hold> hold_span(segment_span& s, stream_ref stream);
  /// Grows held span `s` to at least `bytes` where it is, for use on `stream`: the bytes after it
  /// must be free or uncommitted (the holes are committed), in its size class. Returns the streams
  /// the holder must wait for, or
  /// nullopt when they are not free, or out of memory (nothing changed). Throws as carve.
  [[nodiscard]] std::optional<stream_set> extend_span(segment_span& s, std::size_t bytes, stream_ref stream);
  /// `s` goes for good: its bytes (if placed) become free, with `used_on`, and its record is deleted.
  void give_back_span(segment_span* s, const stream_set& used_on) noexcept;
  /// Yields every idle span (the out-of-memory step: their bytes become free ranges, which trim
  /// can then decommit). Returns the bytes yielded.
  std::size_t yield_idle_spans() noexcept;
  /// Every span record, in the order they were made (for tests).
  [[nodiscard]] std::vector<const segment_span*> spans() const;

  // ---- carving at an address (segment_spans.cpp): a cache handing out again the bytes it handed out
  // before (a private pool restored to a checkpoint) ------------------------------------------------
  /// A range in use over the bytes a carve_exact would take: a piece, or a span.
  struct in_use {
    range* node;
    std::uintptr_t address;
    std::size_t bytes;
    bool span;
  };
  /// The ranges in use over [address, address + piece_bytes(bytes)), in address order: what must
  /// become free before carve_exact can carve there. nullopt when those bytes cannot be a piece of
  /// this heap: not inside one segment, in a segment of the other pool than pieces of that size, or
  /// not at a multiple of the piece unit. Throws size_error as piece_bytes.
  [[nodiscard]] std::optional<std::vector<in_use>> in_use_over(std::uintptr_t address, std::size_t bytes) const;
  /// A piece of exactly [address, address + piece_bytes(bytes)) for `stream`, when every byte of it
  /// is free or uncommitted (the holes are committed). nullopt: some byte is in use, the bytes cannot
  /// be a piece (in_use_over), or out of memory; nothing changed then. Throws as carve.
  [[nodiscard]] std::optional<carved> carve_exact(std::uintptr_t address, std::size_t bytes, stream_ref stream);

  /// Checks every invariant (commits inside their reservation and apart, ranges tile exactly
  /// the committed bytes, no two free ranges touch, the free indexes hold exactly the free
  /// ranges, counters match, and after a trim that could give back no more, no free segment and
  /// no free whole commit); throws std::logic_error naming the first violation. For tests.
  void check() const;

  /// Every segment with its ranges in address order (segment_layout.hpp), segments in the order
  /// they were made: what a memory map shows (segment_layout.cpp). Caller holds the heap's lock.
  /// Throws std::bad_alloc only.
  [[nodiscard]] std::vector<segment_layout> layout() const;

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
  /// carve's work after rounding: a free range, else yielded idle spans of the pool, else growth
  /// (for a span: in the span half, span_floor).
  std::optional<carved> carve_rounded(pool_state& pool, std::size_t bytes, stream_ref stream, placement where,
                                      bool for_span = false);
  /// Makes `r` free (joined with free neighbours, indexed) with `used_on`; the caller uncounts it
  /// (and clears a span's flag).
  std::size_t free_range(range* r, const stream_set& used_on) noexcept;

  // Spans (segment_spans.cpp).
  void check_spans(std::size_t span_ranges) const;  // segment_check.cpp: the records against the ranges
  [[nodiscard]] std::size_t placed_spans() const noexcept;
  /// The piece just taken becomes the range of span `s`, which is placed there.
  void place_span(segment_span& s, const carved& c) noexcept;
  /// Idle span `s` goes back to the free ranges.
  std::size_t yield_span(segment_span& s) noexcept;
  /// Yields idle spans of `pool`, least recently idle first, until a free range fits `bytes`.
  std::optional<fit> yield_until_fit(pool_state& pool, std::size_t bytes, placement where) noexcept;
  /// A piece of exactly [address, address + bytes) of `seg`, when every byte of it is free or
  /// uncommitted (committing the holes); nullopt when some byte is in a piece or span, or out of
  /// memory (nothing changed then). Throws what commit throws, after undoing its own commits.
  std::optional<carved> carve_at(segment& seg, std::uintptr_t address, std::size_t bytes, stream_ref stream);
  /// A free range over `bytes` just committed at `offset` of `seg`, joined with free neighbours and
  /// indexed (records and index nodes reserved by the caller).
  void adopt_commit(segment& seg, std::unique_ptr<range> fresh, std::size_t offset, std::size_t bytes) noexcept;
  [[nodiscard]] segment* segment_of(std::uintptr_t address) const noexcept;
  /// The segment a piece of exactly `n` bytes (a piece size) at `address` would lie in, or null
  /// (in_use_over says when).
  [[nodiscard]] segment* segment_for_piece_at(std::uintptr_t address, std::size_t n) const noexcept;

  // Growth (segment_growth.cpp): a free range (in the index) able to hold `bytes`, or null
  // when the backend is out of memory.
  range* grow(pool_state& pool, pool_id id, std::size_t bytes, placement where, stream_ref stream, bool for_span);
  /// Spans grow from the middle of a virtual-memory reservation up, pieces from its base: a yielded
  /// span's bytes then lie between holes, so a piece they cannot hold commits what they lack, next to
  /// them, not the whole piece (docs/segments.md, "Spans"). An offset, in whole granules.
  [[nodiscard]] static std::size_t span_floor(std::size_t reserved, std::size_t granularity) noexcept;
  struct vm_growth {
    range* grown = nullptr;         ///< null: out of memory, or no address space (below)
    bool no_address_space = false;  ///< the reservation was refused
  };
  /// The first commit goes at offset `at` (a multiple of the granularity).
  vm_growth new_vm_segment(pool_state& pool, pool_id id, std::size_t reserve, std::size_t commit, bool growable,
                           std::size_t at = 0);
  range* new_growable_segment(pool_state& pool, pool_id id, std::size_t bytes, stream_ref stream, bool for_span);
  /// options_.reserve_bytes in whole granules of vm_ (which is set): what a growable segment
  /// reserves until the backend refuses it.
  [[nodiscard]] std::size_t full_reservation() const noexcept;
  range* new_plain_segment(pool_state& pool, pool_id id, std::size_t bytes, stream_ref stream);
  /// Makes `seg` the pool's, with one free range over its commit at offset `at`.
  range* adopt(pool_state& pool, pool_id id, std::unique_ptr<segment> seg, std::unique_ptr<range> whole,
               std::size_t at = 0) noexcept;

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
  /// `for_span`: only commits at or above each segment's span_floor.
  [[nodiscard]] std::optional<hole> best_hole(pool_id id, std::size_t bytes, placement where, bool for_span) const;
  void consider_holes(const segment& seg, std::size_t bytes, placement where, bool for_span,
                      std::optional<hole>& best) const;
  range* fill_hole(pool_state& pool, const hole& h);

  // Trim (segment_trim.cpp).
  std::size_t free_segment(segment& seg);
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

  std::uint64_t tick_ = 0;  ///< the last use of segments and spans (least recently used first)
  std::uint64_t next_segment_id_ = 1;
  segment_heap_totals totals_;
  /// Span records from carve_span to give_back_span, in the order they were made, and the id of the next.
  struct span_book {
    std::vector<std::unique_ptr<segment_span>> records;
    std::uint64_t next_id = 1;
  };
  span_book spans_;
  /// Address space a new growable segment reserves: full_reservation(), halved each time the
  /// backend refuses it, and back to full_reservation() once trim releases a reservation (docs/
  /// design.md, "Virtual memory failure rules").
  std::size_t reservation_ = 0;
  /// The last trim could give back no more, and no piece came back since: no segment is free and
  /// no commit lies entirely in a free range (check() verifies it).
  bool fully_trimmed_ = false;
  segment_heap_events events_;
};

}  // namespace refpool::detail
