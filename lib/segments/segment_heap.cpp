// segment_heap: carving pieces by best fit, giving them back with coalescing, and stats. Growth
// is in segment_growth.cpp and segment_holes.cpp, trimming in segment_trim.cpp, the consistency
// check in segment_check.cpp.
#include "segment_heap.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "access.hpp"
#include "backend_state.hpp"
#include "poison.hpp"
#include "range_list.hpp"
#include "size_math.hpp"

namespace refpool::detail {

segment_heap::segment_heap(backend be, segment_heap_options options)
    : backend_(std::move(be)), options_(options), granule_(0), host_visible_(false) {
  if (!backend_) throw invalid_argument("refpool: a segment heap needs a backend");
  host_visible_ = backend_.kind() == memory_kind::host || backend_.kind() == memory_kind::pinned_host;
  // The rule the cache chose this backend's keys by (backend_state): they cannot disagree.
  piece_unit_choice choice = choose_piece_unit(backend_.alignment(), options_);
  if (choice.unit == 0) throw config_error(std::move(choice.problem));
  granule_ = choice.unit;
  if (options_.use_virtual_memory) {
    virtual_memory* vm = backend_.underlying().address_space();
    // A commit unit that is not a multiple of the piece unit would leave pieces misaligned at
    // commit boundaries; such a backend grows by allocation instead.
    if (vm != nullptr && std::has_single_bit(vm->granularity()) && vm->granularity() % granule_ == 0) {
      vm_ = vm;
      reservation_ = full_reservation();
    }
  }
}

segment_heap::~segment_heap() {
  if (totals_.pieces_out != placed_spans() || !spans_.records.empty())
    fmt::print(stderr,
               "refpool: segment heap of {} destroyed with {} pieces ({} B) and {} spans ({} B placed) still out; "
               "their segments are left allocated\n",
               backend_.name(), totals_.pieces_out - placed_spans(), totals_.used - totals_.spanned,
               spans_.records.size(), totals_.spanned);
  // Whole free segments go back. Those holding pieces keep their memory, so that the pieces
  // stay valid (a caller bug, reported above); only their records go.
  for (std::size_t i = segments_.size(); i-- > 0;) {
    if (segments_[i]->pieces == 0) {
      try {
        free_segment(*segments_[i]);
        continue;
      } catch (const std::exception& e) {
        fmt::print(stderr, "refpool: segment heap of {}: {}\n", backend_.name(), e.what());
      }
    }
    segments_[i]->vm.abandon();  // its memory stays, for the pieces still out
    drop_segment(*segments_[i]);
  }
}

std::size_t segment_heap::piece_bytes(std::size_t bytes) const {
  if (bytes == 0) throw size_error("refpool: cannot carve a piece of 0 bytes");
  return checked_round_up(bytes, granule_, "piece granularity");
}

segment_heap::pool_state& segment_heap::pool_for(std::size_t bytes) noexcept {
  return pools_[static_cast<std::size_t>(bytes <= options_.small_max ? pool_id::small : pool_id::large)];
}

std::optional<std::size_t> segment_heap::offset_in(const range& r, std::size_t bytes, placement where) const noexcept {
  if (r.bytes < bytes) return std::nullopt;
  const segment& seg = *r.owner;
  if (where == placement::anywhere || !seg.virtual_memory()) return 0;
  // The first window of `bytes` inside [r.address, r.end()) that one commit holds (the commits
  // overlapping a range cover it: ranges lie in committed bytes).
  const std::size_t start = r.address - seg.base;
  const std::size_t end = start + r.bytes;
  const auto& commits = seg.vm.commits();
  for (std::size_t i = seg.vm.first_ending_after(start); i < commits.size() && commits[i].offset < end; ++i) {
    const std::size_t lo = std::max(start, commits[i].offset);
    const std::size_t hi = std::min(end, commits[i].end());
    if (hi - lo >= bytes) return lo - start;
  }
  return std::nullopt;
}

std::optional<segment_heap::fit> segment_heap::find_fit(pool_state& pool, std::size_t bytes,
                                                        placement where) const noexcept {
  for (auto it = pool.free.lower_bound(bytes); it != pool.free.end(); ++it)
    if (const auto offset = offset_in(**it, bytes, where)) return fit{*it, *offset};
  return std::nullopt;
}

void segment_heap::prepare_carve(pool_state& pool) {
  // Index nodes for the carve's worst case (a grown range and two remainders) and one more per
  // piece or placed span out (totals_.pieces_out counts both), so that give_back never allocates: each
  // pool keeps at least as many spare nodes as ranges are out, and a give_back uses at most one.
  pool.free.reserve(totals_.pieces_out + 3);
  while (spare_ranges_.size() < 2) spare_ranges_.push_back(std::make_unique<range>());
  // Room to keep the records give_back frees, so that a carve after it needs no allocation.
  if (spare_ranges_.capacity() < spare_records) spare_ranges_.reserve(spare_records);
}

segment_heap::carved segment_heap::take(pool_state& pool, fit f, std::size_t bytes, stream_ref stream) noexcept {
  range* r = f.r;
  segment& seg = *r->owner;
  const std::uintptr_t start = r->address + f.offset;
  const std::uintptr_t end = start + bytes;
  const std::uintptr_t old_end = r->end();
  const stream_set old_streams = r->streams;
  pool.free.erase(r);

  range* p = r;
  if (f.offset > 0) {  // r stays free, as the part before the piece
    p = spare_ranges_.back().release();
    spare_ranges_.pop_back();
    p->owner = &seg;
    link_after(seg, r, p);
    r->bytes = f.offset;
    pool.free.insert(r);
    ++events_.splits;
  }
  p->address = start;
  p->bytes = bytes;
  p->free = false;
  p->streams.clear();
  if (end < old_end) {  // the part after the piece stays free
    range* rest = spare_ranges_.back().release();
    spare_ranges_.pop_back();
    rest->owner = &seg;
    rest->address = end;
    rest->bytes = old_end - end;
    rest->free = true;
    rest->streams = old_streams;
    link_after(seg, p, rest);
    pool.free.insert(rest);
    ++events_.splits;
  }
  if (host_visible_) unpoison_bytes(start, bytes);
  ++seg.pieces;
  seg.last_use = ++tick_;
  totals_.used += bytes;
  ++totals_.pieces_out;
  ++events_.carves;
  return carved{piece{reinterpret_cast<void*>(start), bytes, seg.id, p}, old_streams.without(stream)};
}

std::optional<segment_heap::carved> segment_heap::carve_free(std::size_t bytes, stream_ref stream, placement where) {
  const std::size_t n = piece_bytes(bytes);
  pool_state& pool = pool_for(n);
  prepare_carve(pool);
  const auto f = find_fit(pool, n, where);
  if (!f) return std::nullopt;
  return take(pool, *f, n, stream);
}

std::optional<segment_heap::carved> segment_heap::carve(std::size_t bytes, stream_ref stream, placement where) {
  const std::size_t n = piece_bytes(bytes);
  pool_state& pool = pool_for(n);
  prepare_carve(pool);
  return carve_rounded(pool, n, stream, where);
}

std::optional<segment_heap::carved> segment_heap::carve_rounded(pool_state& pool, std::size_t n, stream_ref stream,
                                                                placement where, bool for_span) {
  if (const auto f = find_fit(pool, n, where)) return take(pool, *f, n, stream);
  // Before the pool grows: the bytes of idle spans (docs/segments.md, "One memory space").
  if (!spans_.records.empty())
    if (const auto f = yield_until_fit(pool, n, where)) return take(pool, *f, n, stream);
  const pool_id id = n <= options_.small_max ? pool_id::small : pool_id::large;
  range* r = grow(pool, id, n, where, stream, for_span);
  if (r == nullptr) return std::nullopt;
  const auto offset = offset_in(*r, n, where);
  if (!offset)
    throw std::logic_error("refpool: segment heap grew a range that cannot hold the piece (a bug in refpool)");
  return take(pool, fit{r, *offset}, n, stream);
}

std::size_t segment_heap::give_back(const piece& p, const stream_set& used_on) noexcept {
  range* r = p.node;
  assert(r != nullptr && !r->free && !r->span && r->address == reinterpret_cast<std::uintptr_t>(p.address) &&
         r->bytes == p.bytes);
  --totals_.pieces_out;
  return free_range(r, used_on);
}

std::size_t segment_heap::free_range(range* r, const stream_set& used_on) noexcept {
  segment& seg = *r->owner;
  pool_state& pool = pools_[static_cast<std::size_t>(seg.pool)];
  r->free = true;
  r->streams = used_on;
  if (host_visible_) poison_bytes(r->address, r->bytes);
  totals_.used -= r->bytes;
  --seg.pieces;
  seg.last_use = ++tick_;
  fully_trimmed_ = false;
  r = join_free_neighbours(seg, pool.free, r, &events_.merges, [this](range* q) { keep_spare(q); });
  pool.free.insert(r);
  return r->bytes;
}

void segment_heap::keep_spare(range* r) noexcept {
  if (spare_ranges_.size() < spare_ranges_.capacity()) {
    *r = range{};
    spare_ranges_.emplace_back(r);  // within capacity: never allocates
  } else {
    delete r;
  }
}

void segment_heap::forget_streams() noexcept {
  for (const auto& seg : segments_)
    for (range* r = seg->first; r != nullptr; r = r->next)
      if (r->free) r->streams.clear();
  for (const auto& s : spans_.records)
    if (s->now == segment_span::state::idle) s->used_on.clear();  // its owner uses none of its bytes
}

std::size_t segment_heap::physical_allocations(const piece& p) const noexcept {
  const range& r = *p.node;
  const segment& seg = *r.owner;
  if (!seg.virtual_memory()) return 1;
  const std::size_t start = r.address - seg.base;
  const std::size_t end = start + r.bytes;
  const auto& commits = seg.vm.commits();
  std::size_t i = seg.vm.first_ending_after(start);
  const std::size_t first = i;
  while (i < commits.size() && commits[i].offset < end) ++i;
  return i - first;
}

segment_heap_stats segment_heap::stats() const noexcept {
  segment_heap_stats s;
  s.events = events_;
  s.segments = segments_.size();
  s.reserved_bytes = totals_.reserved;
  s.committed_bytes = totals_.committed;
  s.used_bytes = totals_.used - totals_.spanned;
  s.span_bytes = totals_.spanned;
  for (const auto& sp : spans_.records)
    if (sp->now == segment_span::state::idle) s.idle_span_bytes += sp->bytes;
  s.spans = spans_.records.size();
  s.free_bytes = totals_.committed - totals_.used;
  s.largest_free_bytes = std::max(pools_[0].free.largest(), pools_[1].free.largest());
  s.free_ranges = pools_[0].free.size() + pools_[1].free.size();
  s.pieces_out = totals_.pieces_out - placed_spans();
  s.physical_allocations = totals_.physical;
  return s;
}

}  // namespace refpool::detail
