// segment_heap: carving pieces by best fit, giving them back with coalescing, stats and the
// consistency check. Growth is in segment_growth.cpp, trimming in segment_trim.cpp.
#include "segment_heap.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "access.hpp"
#include "cache/backend_state.hpp"
#include "poison.hpp"
#include "size_math.hpp"

namespace refpool::detail {

namespace {

void link_after(segment& seg, range* a, range* b) noexcept {
  b->prev = a;
  b->next = a->next;
  if (a->next != nullptr)
    a->next->prev = b;
  else
    seg.last = b;
  a->next = b;
}

void unlink(segment& seg, range* r) noexcept {
  if (r->prev != nullptr)
    r->prev->next = r->next;
  else
    seg.first = r->next;
  if (r->next != nullptr)
    r->next->prev = r->prev;
  else
    seg.last = r->prev;
}

}  // namespace

segment_heap::segment_heap(backend be, segment_heap_options options)
    : backend_(std::move(be)), options_(options), granule_(0), host_visible_(false) {
  if (!backend_) throw invalid_argument("refpool: a segment heap needs a backend");
  host_visible_ = backend_.kind() == memory_kind::host || backend_.kind() == memory_kind::pinned_host;
  const auto power_of_two = [](std::size_t v) { return v != 0 && std::has_single_bit(v); };
  if (!power_of_two(options_.piece_granularity))
    throw config_error(fmt::format("refpool: segment heap piece granularity {} B is not a power of two",
                                   options_.piece_granularity));
  granule_ = std::max(options_.piece_granularity, backend_.alignment());
  if (!power_of_two(granule_))
    throw config_error(fmt::format("refpool: backend alignment {} B is not a power of two", backend_.alignment()));
  const auto multiple = [&](std::size_t v, const char* what) {
    if (v == 0 || v % granule_ != 0)
      throw config_error(fmt::format("refpool: segment heap option {} = {} B is not a positive multiple of the "
                                     "{} B piece granularity", what, v, granule_));
  };
  multiple(options_.small_segment, "small_segment");
  multiple(options_.large_segment, "large_segment");
  multiple(options_.segment_rounding, "segment_rounding");
  if (options_.growth_divisor == 0)
    throw config_error("refpool: segment heap option growth_divisor must be at least 1");
  if (options_.small_max == 0 || options_.small_max > options_.small_segment)
    throw config_error(fmt::format("refpool: segment heap option small_max = {} B must be in [1, small_segment = {} B]",
                                   options_.small_max, options_.small_segment));
  if (options_.use_virtual_memory) {
    virtual_memory* vm = backend_.underlying().address_space();
    // A commit unit that is not a multiple of the piece unit would leave pieces misaligned at
    // commit boundaries; such a backend grows by allocation instead.
    if (vm != nullptr && power_of_two(vm->granularity()) && vm->granularity() % granule_ == 0) {
      vm_ = vm;
      options_.reserve_bytes = round_up(std::max(options_.reserve_bytes, vm->granularity()), vm->granularity());
    }
  }
}

segment_heap::~segment_heap() {
  if (pieces_out_ != 0)
    fmt::print(stderr, "refpool: segment heap of {} destroyed with {} pieces ({} B) still out; their segments are "
               "left allocated\n", backend_.name(), pieces_out_, used_);
  // Whole free segments go back. Those holding pieces keep their memory, so that the pieces
  // stay valid (a caller bug, reported above); only their records go.
  for (std::size_t i = segments_.size(); i-- > 0;) {
    if (segments_[i]->pieces == 0) {
      try {
        release_segment(*segments_[i]);
        continue;
      } catch (const std::exception& e) {
        fmt::print(stderr, "refpool: segment heap of {}: {}\n", backend_.name(), e.what());
      }
    }
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

std::optional<std::size_t> segment_heap::offset_in(const range& r, std::size_t bytes,
                                                   placement where) const noexcept {
  if (r.bytes < bytes) return std::nullopt;
  const segment& seg = *r.owner;
  if (where == placement::anywhere || !seg.virtual_memory) return 0;
  // The first window of `bytes` inside [r.address, r.end()) that one commit holds.
  const std::size_t start = r.address - seg.base;
  const std::size_t end = start + r.bytes;
  auto it = std::upper_bound(seg.commit_ends.begin(), seg.commit_ends.end(), start);
  for (; it != seg.commit_ends.end(); ++it) {
    const std::size_t commit_start = it == seg.commit_ends.begin() ? 0 : *(it - 1);
    const std::size_t lo = std::max(start, commit_start);
    const std::size_t hi = std::min(end, *it);
    if (hi - lo >= bytes) return lo - start;
    if (*it >= end) break;
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
  // piece out, so that give_back never allocates: each pool keeps at least as many spare nodes
  // as it has pieces out, and a give_back uses at most one.
  pool.free.reserve(pieces_out_ + 3);
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
    ++counts_.splits;
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
    ++counts_.splits;
  }
  if (host_visible_) unpoison_bytes(start, bytes);
  ++seg.pieces;
  seg.last_use = ++tick_;
  used_ += bytes;
  ++pieces_out_;
  ++counts_.carves;
  return carved{piece{reinterpret_cast<void*>(start), bytes, seg.id, p}, old_streams.without(stream)};
}

std::optional<segment_heap::carved> segment_heap::carve_free(std::size_t bytes, stream_ref stream,
                                                             placement where) {
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
  if (const auto f = find_fit(pool, n, where)) return take(pool, *f, n, stream);
  const pool_id id = n <= options_.small_max ? pool_id::small : pool_id::large;
  range* r = grow(pool, id, n, where, stream);
  if (r == nullptr) return std::nullopt;
  const auto offset = offset_in(*r, n, where);
  if (!offset) throw std::logic_error("refpool: segment heap grew a range that cannot hold the piece (a bug in refpool)");
  return take(pool, fit{r, *offset}, n, stream);
}

std::size_t segment_heap::give_back(const piece& p, const stream_set& used_on) noexcept {
  range* r = p.node;
  assert(r != nullptr && !r->free && r->address == reinterpret_cast<std::uintptr_t>(p.address) &&
         r->bytes == p.bytes);
  segment& seg = *r->owner;
  pool_state& pool = pools_[static_cast<std::size_t>(seg.pool)];
  r->free = true;
  r->streams = used_on;
  if (host_visible_) poison_bytes(r->address, r->bytes);
  used_ -= r->bytes;
  --pieces_out_;
  --seg.pieces;
  seg.last_use = ++tick_;
  if (range* before = r->prev; before != nullptr && before->free) {
    pool.free.erase(before);
    before->bytes += r->bytes;
    before->streams.merge(r->streams);
    unlink(seg, r);
    keep_spare(r);
    r = before;
    ++counts_.merges;
  }
  if (range* after = r->next; after != nullptr && after->free) {
    pool.free.erase(after);
    r->bytes += after->bytes;
    r->streams.merge(after->streams);
    unlink(seg, after);
    keep_spare(after);
    ++counts_.merges;
  }
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
}

std::size_t segment_heap::physical_allocations(const piece& p) const noexcept {
  const range& r = *p.node;
  const segment& seg = *r.owner;
  if (!seg.virtual_memory) return 1;
  const std::size_t start = r.address - seg.base;
  const std::size_t end = start + r.bytes;
  std::size_t count = 0;
  std::size_t commit_start = 0;
  for (const std::size_t commit_end : seg.commit_ends) {
    if (commit_start < end && start < commit_end) ++count;
    commit_start = commit_end;
  }
  return count;
}

segment_heap_stats segment_heap::stats() const noexcept {
  segment_heap_stats s = counts_;
  s.segments = segments_.size();
  s.reserved_bytes = reserved_;
  s.committed_bytes = committed_;
  s.used_bytes = used_;
  s.free_bytes = committed_ - used_;
  s.largest_free_bytes = std::max(pools_[0].free.largest(), pools_[1].free.largest());
  s.free_ranges = pools_[0].free.size() + pools_[1].free.size();
  s.pieces_out = pieces_out_;
  s.physical_allocations = physical_;
  return s;
}

std::vector<segment_heap::range_view> segment_heap::ranges() const {
  std::vector<range_view> out;
  for (const auto& seg : segments_)
    for (const range* r = seg->first; r != nullptr; r = r->next)
      out.push_back(range_view{r->address, r->bytes, r->free, seg->id, r->streams});
  return out;
}

void segment_heap::check() const {
  const auto fail = [](std::string what) { throw std::logic_error("refpool: segment heap inconsistent: " + what); };
  std::size_t reserved = 0, committed = 0, used = 0, pieces = 0, physical = 0;
  std::array<std::size_t, 2> free_ranges{};
  for (const auto& seg_ptr : segments_) {
    const segment& seg = *seg_ptr;
    reserved += seg.reserved;
    committed += seg.committed;
    if (seg.committed == 0 || seg.committed > seg.reserved)
      fail(fmt::format("segment {} commits {} of {} B", seg.id, seg.committed, seg.reserved));
    if (seg.virtual_memory) {
      if (seg.commit_ends.empty() || seg.commit_ends.back() != seg.committed ||
          !std::is_sorted(seg.commit_ends.begin(), seg.commit_ends.end()))
        fail(fmt::format("segment {}: commits do not end at its committed size", seg.id));
      physical += seg.commit_ends.size();
    } else {
      if (seg.committed != seg.reserved || !seg.commit_ends.empty())
        fail(fmt::format("segment {}: a backend allocation is all committed", seg.id));
      ++physical;
    }
    if (seg.growable && pools_[static_cast<std::size_t>(seg.pool)].growable != &seg)
      fail(fmt::format("segment {} is growable but not its pool's", seg.id));
    std::uintptr_t expected = seg.base;
    std::size_t seg_pieces = 0;
    const range* prev = nullptr;
    if (seg.first == nullptr || seg.first->prev != nullptr) fail(fmt::format("segment {}: bad first range", seg.id));
    for (const range* r = seg.first; r != nullptr; prev = r, r = r->next) {
      if (r->owner != &seg || r->prev != prev) fail(fmt::format("segment {}: broken range links", seg.id));
      if (r->address != expected) fail(fmt::format("segment {}: gap or overlap at {:#x}", seg.id, r->address));
      if (r->bytes == 0 || r->bytes % granule_ != 0 || (r->address - seg.base) % granule_ != 0)
        fail(fmt::format("segment {}: range at {:#x} of {} B is off the {} B grid", seg.id, r->address, r->bytes,
                         granule_));
      const bool indexed = pools_[static_cast<std::size_t>(seg.pool)].free.contains(const_cast<range*>(r));
      if (r->free) {
        if (prev != nullptr && prev->free) fail(fmt::format("segment {}: two free neighbours at {:#x}", seg.id, r->address));
        if (!indexed) fail(fmt::format("segment {}: free range at {:#x} not indexed", seg.id, r->address));
        ++free_ranges[static_cast<std::size_t>(seg.pool)];
      } else {
        if (indexed) fail(fmt::format("segment {}: piece at {:#x} is indexed as free", seg.id, r->address));
        used += r->bytes;
        ++seg_pieces;
      }
      expected = r->end();
    }
    if (prev != seg.last) fail(fmt::format("segment {}: bad last range", seg.id));
    if (expected != seg.base + seg.committed)
      fail(fmt::format("segment {}: ranges end at {:#x}, commits at {:#x}", seg.id, expected, seg.base + seg.committed));
    if (seg_pieces != seg.pieces) fail(fmt::format("segment {}: {} pieces counted as {}", seg.id, seg_pieces, seg.pieces));
    pieces += seg_pieces;
  }
  for (std::size_t i = 0; i < 2; ++i)
    if (pools_[i].free.size() != free_ranges[i])
      fail(fmt::format("pool {} indexes {} free ranges, segments have {}", i, pools_[i].free.size(), free_ranges[i]));
  if (reserved != reserved_ || committed != committed_ || used != used_ || pieces != pieces_out_ || physical != physical_)
    fail(fmt::format("totals: reserved {}/{}, committed {}/{}, used {}/{}, pieces {}/{}, physical {}/{}", reserved,
                     reserved_, committed, committed_, used, used_, pieces, pieces_out_, physical, physical_));
}

}  // namespace refpool::detail
