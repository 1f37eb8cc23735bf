// The reference model's arenas as spans, for caches without segments (the model's backends have
// no virtual memory): each (cache, backend) with plans gets a heap of spans alone, as
// lib/cache/segment_source_spans.cpp makes it, written from its rules:
//
// - A span is a range of a segment. A new one takes the smallest free range of its pool (512 B:
//   small; larger: large) that holds its size rounded to 512 (ties: lowest address), at the
//   range's start; with none, the pool's idle spans yield, oldest idle first, until one fits; else
//   one backend allocation of exactly the rounded size (a new segment), with the out-of-memory
//   ladder (idle spans yield, the cache's idle blocks of the backend go, the heap's free segments
//   go; one retry).
// - An arena's span is made at its first claim (after the cache's idle blocks of its backend
//   went), held at each claim (waiting for the streams its bytes were used on), idled at a run's
//   end with no region pinned (or when its last pinned region goes, unclaimed), held again at
//   home when it yielded and nothing took its place (else moved: its regions follow), extended
//   into a free range right after it, or given back and made again when nothing pins it.
// - A span given back frees its range, and every free segment of its heap goes then.
// - A free segment goes to the backend at a trim, after its streams other than its first are
//   ordered before that one.
#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "model.hpp"
#include "model_trace.hpp"

namespace refpool::test::fuzz {

namespace {

constexpr std::size_t piece_unit = 512;

std::size_t round_piece(std::size_t bytes) { return (bytes + piece_unit - 1) / piece_unit * piece_unit; }

void add_stream(std::vector<void*>& set, void* s) {
  if (std::find(set.begin(), set.end(), s) == set.end()) set.push_back(s);
}

void merge_streams(std::vector<void*>& into, const std::vector<void*>& from) {
  for (void* s : from) add_stream(into, s);
}

char* at(const model_heap_segment& seg, std::size_t offset) { return static_cast<char*>(seg.base) + offset; }

}  // namespace

model_span_heap& model::span_heap(int ci, int backend) {
  for (model_span_heap& h : span_heaps)
    if (h.cache == ci && h.backend == backend) return h;
  model_span_heap made;
  made.cache = ci;
  made.backend = backend;
  span_heaps.push_back(std::move(made));  // callers hold no reference to another heap across this
  return span_heaps.back();
}

std::size_t model::span_heap_bytes(int ci, int backend) const {
  std::size_t sum = 0;
  for (const model_span_heap& h : span_heaps)
    if ((ci < 0 || h.cache == ci) && (backend < 0 || h.backend == backend))
      for (const model_heap_segment& seg : h.segments) sum += seg.bytes;
  return sum;
}

std::size_t model::span_heap_free_bytes(const model_span_heap& h) const {
  std::size_t sum = 0;
  for (const model_heap_segment& seg : h.segments)
    for (const model_heap_range& r : seg.ranges)
      if (r.arena < 0) sum += r.bytes;
  return sum;
}

// The heap's ranges of a span: `arena`'s range, found by its base.
static model_heap_range* range_of(model_span_heap& h, const model_arena& a, model_heap_segment** seg_out) {
  for (model_heap_segment& seg : h.segments)
    for (model_heap_range& r : seg.ranges)
      if (at(seg, r.offset) == a.base && r.arena >= 0) {
        if (seg_out != nullptr) *seg_out = &seg;
        return &r;
      }
  return nullptr;
}

// Places `arena`'s span in range `ri` of `seg` at `offset`, `n` bytes: the streams of the range
// other than the arena's are waited for.
void model::take_range(model_span_heap& h, std::size_t si, std::size_t ri, std::size_t offset, std::size_t n,
                       int arena) {
  model_heap_segment& seg = h.segments[si];
  model_arena& a = arenas[static_cast<std::size_t>(arena)];
  model_heap_range whole = seg.ranges[ri];
  std::vector<model_heap_range> parts;
  if (offset > 0) parts.push_back({whole.offset, offset, -1, whole.streams});
  parts.push_back({whole.offset + offset, n, arena, {}});
  if (offset + n < whole.bytes)
    parts.push_back({whole.offset + offset + n, whole.bytes - offset - n, -1, whole.streams});
  seg.ranges.erase(seg.ranges.begin() + static_cast<std::ptrdiff_t>(ri));
  seg.ranges.insert(seg.ranges.begin() + static_cast<std::ptrdiff_t>(ri), parts.begin(), parts.end());
  seg.last_use = ++h.tick;
  a.base = at(seg, whole.offset + offset);
  a.home = a.base;
  a.bytes = n;
  a.span = model_arena::span_state::held;
  a.memory = true;
  a.used_on.clear();
  model_trace("arena {}'s span at {} ({} B) in segment {}", arena, a.base, n, seg.base);
  wait_for_span_streams(arena, whole.streams, "a span's bytes were used on another stream");
}

// The arena's stream is ordered after each of `streams` but itself (wait_for_piece).
void model::wait_for_span_streams(int arena, const std::vector<void*>& streams, const char* why) {
  const model_arena& a = arenas[static_cast<std::size_t>(arena)];
  for (void* s : streams)
    if (s != a.stream) expect_order_streams(a.backend, s, a.stream, fmt::format("for arena {} ({})", arena, why));
}

// The range `r` of `seg` is free now: it joins its free neighbours (streams: the one before's first).
void model::free_range(model_span_heap& h, model_heap_segment& seg, std::size_t ri, const std::vector<void*>& used_on) {
  seg.ranges[ri].arena = -1;
  seg.ranges[ri].streams = used_on;
  seg.last_use = ++h.tick;
  if (ri + 1 < seg.ranges.size() && seg.ranges[ri + 1].arena < 0) {
    merge_streams(seg.ranges[ri].streams, seg.ranges[ri + 1].streams);
    seg.ranges[ri].bytes += seg.ranges[ri + 1].bytes;
    seg.ranges.erase(seg.ranges.begin() + static_cast<std::ptrdiff_t>(ri + 1));
  }
  if (ri > 0 && seg.ranges[ri - 1].arena < 0) {
    merge_streams(seg.ranges[ri - 1].streams, seg.ranges[ri].streams);
    seg.ranges[ri - 1].bytes += seg.ranges[ri].bytes;
    seg.ranges.erase(seg.ranges.begin() + static_cast<std::ptrdiff_t>(ri));
  }
}

// The smallest free range of the pool that holds `n` (ties: the lowest address).
bool model::find_fit(model_span_heap& h, bool small, std::size_t n, std::size_t& si, std::size_t& ri) const {
  bool found = false;
  for (std::size_t s = 0; s < h.segments.size(); ++s) {
    if (h.segments[s].small != small) continue;
    for (std::size_t r = 0; r < h.segments[s].ranges.size(); ++r) {
      const model_heap_range& x = h.segments[s].ranges[r];
      if (x.arena >= 0 || x.bytes < n) continue;
      if (found) {
        const model_heap_range& best = h.segments[si].ranges[ri];
        if (x.bytes > best.bytes) continue;
        if (x.bytes == best.bytes && at(h.segments[s], x.offset) > at(h.segments[si], best.offset)) continue;
      }
      si = s;
      ri = r;
      found = true;
    }
  }
  return found;
}

void model::yield_span(model_span_heap& h, int arena) {
  model_arena& a = arenas[static_cast<std::size_t>(arena)];
  model_heap_segment* seg = nullptr;
  model_heap_range* r = range_of(h, a, &seg);
  if (r == nullptr) fail(fmt::format("model: arena {}'s span is not in its heap", arena));
  model_trace("arena {}'s span at {} ({} B) yields", arena, a.base, a.bytes);
  plan_totals.span_yields += 1;
  a.span = model_arena::span_state::yielded;
  a.memory = false;
  free_range(h, *seg, static_cast<std::size_t>(r - seg->ranges.data()), a.used_on);
  a.used_on.clear();
}

// Every idle span of the heap yields, in the order their records were made.
void model::yield_idle_spans(int ci, int backend) {
  for (model_span_heap& h : span_heaps) {
    if (h.cache != ci || h.backend != backend) continue;
    std::vector<std::pair<std::uint64_t, int>> idle;
    for (std::size_t a = 0; a < arenas.size(); ++a)
      if (arenas[a].cache == ci && arenas[a].backend == backend && arenas[a].span == model_arena::span_state::idle)
        idle.emplace_back(arenas[a].span_record, static_cast<int>(a));
    std::sort(idle.begin(), idle.end());
    for (const auto& [record, a] : idle) yield_span(h, a);
  }
}

// A span of `n` bytes (rounded) for `arena`: a free range, else idle spans of the pool yield, else
// a new segment. False: the backend had no memory (or failed: `error`).
model::backend_result model::carve_rounded(int ci, int arena, std::size_t n) {
  const int backend = arenas[static_cast<std::size_t>(arena)].backend;
  const bool small = n <= piece_unit;
  {
    model_span_heap& h = span_heap(ci, backend);
    std::size_t si = 0, ri = 0;
    if (find_fit(h, small, n, si, ri)) {
      take_range(h, si, ri, 0, n, arena);
      return backend_result::ok;
    }
    for (;;) {
      int oldest = -1;
      for (std::size_t a = 0; a < arenas.size(); ++a) {
        const model_arena& x = arenas[a];
        if (x.cache != ci || x.backend != backend || x.span != model_arena::span_state::idle) continue;
        if ((x.bytes <= piece_unit) != small) continue;
        if (oldest < 0 || x.idle_since < arenas[static_cast<std::size_t>(oldest)].idle_since)
          oldest = static_cast<int>(a);
      }
      if (oldest < 0) break;
      yield_span(h, oldest);
      if (find_fit(h, small, n, si, ri)) {
        take_range(h, si, ri, 0, n, arena);
        return backend_result::ok;
      }
    }
  }
  void* ptr = nullptr;
  const backend_result r = backend_allocate(backend, n, ptr);
  if (r != backend_result::ok) return r;
  model_span_heap& h = span_heap(ci, backend);
  model_heap_segment seg;
  seg.base = ptr;
  seg.bytes = n;
  seg.small = small;
  seg.last_use = ++h.tick;
  seg.ranges.push_back({0, n, -1, {}});
  h.segments.push_back(std::move(seg));
  plan_totals.arenas += 1;
  take_range(h, h.segments.size() - 1, 0, 0, n, arena);
  return backend_result::ok;
}

// With the cache's out-of-memory ladder: reclaim_for_retry, then once more.
bool model::carve_with_retry(int ci, int arena, std::size_t n, bool new_record) {
  const int backend = arenas[static_cast<std::size_t>(arena)].backend;
  // A new span's record goes to the end of its heap's list (a moved one keeps its place).
  if (new_record) arenas[static_cast<std::size_t>(arena)].span_record = ++span_heap(ci, backend).spans_made;
  backend_result r = carve_rounded(ci, arena, n);
  if (r != backend_result::out_of_memory) return r == backend_result::ok;
  reclaim_for_retry(ci, backend);
  return carve_rounded(ci, arena, n) == backend_result::ok;
}

// cache_state::reclaim_for_retry: idle spans yield, the cache's idle blocks of the backend go,
// then the heap of spans trims.
void model::reclaim_for_retry(int ci, int backend) {
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  c.oom_retries += 1;
  yield_idle_spans(ci, backend);
  free_idle(ci, 0, backend, c.reclaimed);
  trim_span_heap(ci, backend, 0);
}

// The heap's free segments go, least recently used first, while its free bytes exceed `keep`.
// Returns its free bytes after.
std::size_t model::trim_span_heap(int ci, int backend, std::size_t keep) {
  for (std::size_t hi = 0; hi < span_heaps.size(); ++hi) {
    model_span_heap& h = span_heaps[hi];
    if (h.cache != ci || h.backend != backend) continue;
    for (;;) {
      if (span_heap_free_bytes(h) <= keep) break;
      std::size_t pick = h.segments.size();
      for (std::size_t s = 0; s < h.segments.size(); ++s)
        if (h.segments[s].ranges.size() == 1 && h.segments[s].ranges[0].arena < 0 &&
            (pick == h.segments.size() || h.segments[s].last_use < h.segments[pick].last_use))
          pick = s;
      if (pick == h.segments.size()) break;
      free_segment(h, pick);
    }
    return span_heap_free_bytes(h);
  }
  return 0;
}

void model::free_segment(model_span_heap& h, std::size_t si) {
  const model_heap_segment seg = h.segments[si];
  const std::vector<void*>& streams = seg.ranges[0].streams;
  for (std::size_t i = 1; i < streams.size(); ++i) {
    const backend_event* next = log_.next();  // not next_event: settle_arenas calls this
    if (next == nullptr) fail("model expected order_streams before a segment goes, refpool made no call");
    const backend_event& e = *next;
    if (e.what != backend_event::kind::order_streams || e.backend != h.backend || e.producer != streams[i] ||
        e.consumer != streams[0])
      fail(fmt::format("model expected order_streams({} -> {}) before segment {} goes, refpool made {}", streams[i],
                       streams[0], seg.base, describe(e)));
  }
  const backend_event* next = log_.next();
  if (next == nullptr)
    fail(fmt::format("model expected segment {} ({} B) of backend {} to be freed, refpool made no call", seg.base,
                     seg.bytes, h.backend));
  const backend_event& e = *next;
  if (e.what != backend_event::kind::deallocate || e.backend != h.backend || e.ptr != seg.base || e.bytes != seg.bytes)
    fail(fmt::format("model expected segment {} ({} B) of backend {} to be freed, refpool made {}", seg.base, seg.bytes,
                     h.backend, describe(e)));
  be[h.backend].outstanding -= seg.bytes;
  plan_totals.arena_frees += 1;
  model_trace("segment {} ({} B) freed", seg.base, seg.bytes);
  h.segments.erase(h.segments.begin() + static_cast<std::ptrdiff_t>(si));
}

// ~arena, free_memory: the span's range is freed, then every free segment of its heap goes.
void model::give_back_span(int arena) {
  model_arena& a = arenas[static_cast<std::size_t>(arena)];
  if (a.span == model_arena::span_state::none || a.span == model_arena::span_state::gone) return;
  model_span_heap& h = span_heap(a.cache, a.backend);
  if (a.memory) {
    model_heap_segment* seg = nullptr;
    model_heap_range* r = range_of(h, a, &seg);
    if (r == nullptr) fail(fmt::format("model: arena {}'s span is not in its heap", arena));
    std::vector<void*> used{a.stream};
    for (void* s : a.waits) add_stream(used, s);
    free_range(h, *seg, static_cast<std::size_t>(r - seg->ranges.data()), used);
  }
  model_trace("arena {}'s span given back", arena);
  a.span = model_arena::span_state::gone;
  a.memory = false;
  // free_or_trim: with no span left every segment goes, the newest first; else a trim.
  bool spans_left = false;
  for (const model_arena& x : arenas)
    spans_left = spans_left || (x.cache == h.cache && x.backend == h.backend &&
                                x.span != model_arena::span_state::none && x.span != model_arena::span_state::gone);
  if (!spans_left) {
    while (!h.segments.empty()) free_segment(h, h.segments.size() - 1);
    return;
  }
  trim_span_heap(h.cache, h.backend, 0);
}

void model::idle_span(int arena) {
  model_arena& a = arenas[static_cast<std::size_t>(arena)];
  if (a.span != model_arena::span_state::held) return;
  a.span = model_arena::span_state::idle;
  a.used_on = {a.stream};
  for (void* s : a.waits) add_stream(a.used_on, s);
  a.idle_since = ++span_heap(a.cache, a.backend).tick;
  model_trace("arena {}'s span idles", arena);
}

// No region of `arena` is pinned (live past its run).
bool model::arena_unpinned(int arena) const {
  for (int p : arenas[static_cast<std::size_t>(arena)].plans)
    for (const model_region& reg : plans[static_cast<std::size_t>(p)].regions)
      if (reg.live && reg.pinned) return false;
  return true;
}

// arena::take: the claimer's span, made, held again or extended. False: the run is plain.
bool model::take_arena(int arena) {
  model_arena& a0 = arenas[static_cast<std::size_t>(arena)];
  const int ci = a0.cache;
  const bool placed_before = a0.span != model_arena::span_state::none && a0.span != model_arena::span_state::gone;
  // Its first placement, or its first claim after a plan joined: the plain path's idle memory first.
  const bool joined = std::exchange(a0.reclaim_before_take, false);
  if (!placed_before || joined) free_idle(ci, 0, a0.backend, caches[static_cast<std::size_t>(ci)].reclaimed);
  if (!placed_before) return carve_with_retry(ci, arena, round_piece(a0.needed), true);
  model_span_heap& h = span_heap(ci, a0.backend);
  if (a0.span == model_arena::span_state::idle) {
    model_arena& a = arenas[static_cast<std::size_t>(arena)];
    a.span = model_arena::span_state::held;
    const std::vector<void*> waits = a.used_on;
    a.used_on.clear();
    wait_for_span_streams(arena, waits, "an idle span held again");
  } else if (a0.span == model_arena::span_state::yielded) {
    // Home again when its bytes there are free; else anywhere (moved: its regions follow).
    const std::size_t n = a0.bytes;
    bool home = false;
    for (std::size_t si = 0; si < h.segments.size() && !home; ++si) {
      model_heap_segment& seg = h.segments[si];
      if (a0.home < seg.base || a0.home >= at(seg, seg.bytes) || seg.small != (n <= piece_unit)) continue;
      const std::size_t off = static_cast<std::size_t>(static_cast<char*>(a0.home) - static_cast<char*>(seg.base));
      for (std::size_t ri = 0; ri < seg.ranges.size(); ++ri) {
        const model_heap_range& r = seg.ranges[ri];
        if (r.arena < 0 && r.offset <= off && off + n <= r.offset + r.bytes) {
          take_range(h, si, ri, off - r.offset, n, arena);
          home = true;
          break;
        }
      }
      break;
    }
    if (!home) {
      void* was = a0.home;
      if (!carve_with_retry(ci, arena, n, false)) {
        arenas[static_cast<std::size_t>(arena)].home = was;
        return false;
      }
      model_trace("arena {} moved: its regions follow", arena);
      plan_totals.span_moves += 1;  // handed out at base + offset
    }
  }
  model_arena& a = arenas[static_cast<std::size_t>(arena)];
  if (a.bytes >= a.needed) return true;
  // Extended into a free range right after it, else (nothing pinned) given back and made again.
  const std::size_t n = round_piece(a.needed);
  if (extend_span(arena, a.needed)) {
    caches[static_cast<std::size_t>(ci)].plans.growths += 1;
    return true;
  }
  if (!arena_unpinned(arena)) return false;
  give_back_span(arena);
  arenas[static_cast<std::size_t>(arena)].span = model_arena::span_state::none;
  caches[static_cast<std::size_t>(ci)].plans.replacements += 1;
  plan_totals.span_remakes += 1;
  return carve_with_retry(ci, arena, n, true);
}

// segment_heap::extend_span: a held span takes the free range right after it (same segment,
// same pool) for `bytes` rounded; true when it holds them now.
bool model::extend_span(int arena, std::size_t bytes) {
  model_arena& a = arenas[static_cast<std::size_t>(arena)];
  const std::size_t n = round_piece(bytes);
  if (n <= a.bytes) return true;
  model_span_heap& h = span_heap(a.cache, a.backend);
  model_heap_segment* seg = nullptr;
  model_heap_range* r = range_of(h, a, &seg);
  if (r == nullptr) fail(fmt::format("model: arena {}'s span is not in its heap", arena));
  const std::size_t ri = static_cast<std::size_t>(r - seg->ranges.data());
  if (seg->small || ri + 1 >= seg->ranges.size() || seg->ranges[ri + 1].arena >= 0 ||
      seg->ranges[ri + 1].bytes < n - a.bytes)
    return false;
  extend_into_next(h, *seg, ri, n, arena);
  plan_totals.span_extensions += 1;
  return true;
}

void model::extend_into_next(model_span_heap& h, model_heap_segment& seg, std::size_t ri, std::size_t n, int arena) {
  model_arena& a = arenas[static_cast<std::size_t>(arena)];
  const std::size_t more = n - a.bytes;
  model_heap_range next = seg.ranges[ri + 1];
  wait_for_span_streams(arena, next.streams, "a span extended");
  seg.ranges[ri].bytes += more;
  if (next.bytes == more) {
    seg.ranges.erase(seg.ranges.begin() + static_cast<std::ptrdiff_t>(ri + 1));
  } else {
    seg.ranges[ri + 1].offset += more;
    seg.ranges[ri + 1].bytes -= more;
  }
  seg.last_use = ++h.tick;
  a.bytes = n;
}

}  // namespace refpool::test::fuzz
