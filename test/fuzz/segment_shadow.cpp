// The fuzz harness's property-checked cache with segments (segment_shadow.hpp).
#include "segment_shadow.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "access.hpp"
#include "cache/block.hpp"
#include "cache/cache_state.hpp"
#include "model.hpp"  // fail()

namespace rp = refpool;

namespace refpool::test::fuzz {

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
/// The shadow backend's memory: small enough that the out-of-memory ladder runs often.
constexpr std::size_t capacity = 24 * MiB;
/// During a training loop: room for an arena that grows through virtual memory (16 granules of
/// 2 MiB at least, arena_source.cpp) beside the plain path.
constexpr std::size_t loop_capacity = 256 * MiB;
/// Sizes: mostly small (the small pool, exact-key hits), some large, a few that fill the limit.
constexpr std::size_t sizes[] = {1,       100,      512,      513,       1000,      4096,     4096,
                                 10000,   64 * KiB, 64 * KiB, 100 * KiB, 600 * KiB, MiB,      MiB + 1,
                                 2 * MiB, 3 * MiB,  5 * MiB,  7 * MiB,   11 * MiB,  20 * MiB, 30 * MiB};
constexpr std::size_t keeps[] = {0, 4 * KiB, MiB, 4 * MiB, rp::cache_options::unlimited};
constexpr std::size_t limits[] = {rp::cache_options::unlimited, 0, 64 * KiB, 2 * MiB, 8 * MiB};

struct shadow_totals {
  std::uint64_t operations = 0, pieces = 0, out_of_memory = 0, injected = 0, orphaned_caches = 0, cross_stream = 0;
  std::uint64_t grows = 0, splits = 0, merges = 0;
  std::uint64_t plan_recordings = 0, plan_hits = 0, span_yields = 0, span_returns = 0;
} totals;

rp::stream_ref stream_of(std::uint64_t h) {
  const std::uint64_t s = h % 12;  // mostly the default stream; ten others, so sets can overflow
  return {s < 2 ? nullptr : reinterpret_cast<void*>(static_cast<std::uintptr_t>(s) << 12)};
}

/// Who takes the block behind `ref` back: the cache, a plan (a region), or the backend.
rp::detail::block_origin origin_of(const rp::data_ref& ref) noexcept {
  return static_cast<const rp::detail::block*>(rp::detail::access::block(ref))->origin;
}

/// Where the stamps of a piece of `bytes` go: one word every `stride` bytes.
/// (Large pieces get few: each stamp is a page the host backend must fault in.)
std::size_t stride_for(std::size_t bytes) { return bytes <= 64 * KiB ? 512 : bytes <= 2 * MiB ? 64 * KiB : MiB; }

}  // namespace

segment_shadow::segment_shadow(std::uint64_t seed, runner run_on)
    : seed_(seed),
      run_on_(std::move(run_on)),
      budget_(std::make_shared<rp::byte_budget>(capacity)),
      limited_(std::make_shared<rp::limiting_resource>(rp::make_host_resource(), budget_)),
      failing_(std::make_shared<rp::failing_resource>(limited_)),
      be_(failing_),
      spans_(seed) {
  recreate();
}

segment_shadow::~segment_shadow() = default;

void segment_shadow::recreate() {
  if (step_) step_->end();
  step_.reset();
  rp::cache_options o;
  o.segments = rp::segment_policy::on;
  cache_ = std::make_unique<rp::alloc_cache>(o);  // the old one goes: its live pieces are orphans now
  ++generation_;
}

void segment_shadow::restamp(piece& p) {
  p.stamp = mix(seed_ ^ ++next_stamp_) & ~std::uint64_t{0xFFFFFFF};
  stamp(p);
}

void segment_shadow::stamp(const piece& p) {
  auto* bytes = static_cast<unsigned char*>(p.ref.data());
  const std::size_t n = p.ref.bytes();
  for (std::size_t off = 0; off + 8 <= n; off += stride_for(n)) {
    const std::uint64_t v = p.stamp + off;
    std::memcpy(bytes + off, &v, sizeof v);
  }
}

void segment_shadow::verify(const piece& p, const char* when) const {
  const auto* bytes = static_cast<const unsigned char*>(p.ref.data());
  const std::size_t n = p.ref.bytes();
  for (std::size_t off = 0; off + 8 <= n; off += stride_for(n)) {
    std::uint64_t v = 0;
    std::memcpy(&v, bytes + off, sizeof v);
    if (v != p.stamp + off)
      fail(
          fmt::format("segments: the piece at {} ({} B) lost its owner's stamp at offset {} ({}): another owner "
                      "wrote it",
                      p.ref.data(), n, off, when));
  }
}

rp::data_ref segment_shadow::request(int t, std::size_t bytes, rp::stream_ref s) {
  rp::data_ref made;
  std::string error;
  bool bad = false;
  run_on_(t, [&] {
    try {
      made = cache_->allocate(be_, bytes, s);
    } catch (const rp::out_of_memory&) {
      ++totals.out_of_memory;
    } catch (const rp::backend_error& e) {
      ++totals.injected;
      bad = e.native_code() != -1;
      error = e.what();
    } catch (const std::exception& e) {
      bad = true;
      error = e.what();
    }
  });
  if (bad)
    fail(
        fmt::format("segments: a request of {} B threw something else than out of memory or the injected "
                    "backend_error: {}",
                    bytes, error));
  if (!made) return made;
  // Pieces are whole 512-byte units; plan regions are rounded to 256 bytes.
  const std::size_t unit = origin_of(made) == rp::detail::block_origin::region ? 256 : 512;
  if (made.bytes() != bytes || made.capacity() < bytes || made.capacity() % unit != 0)
    fail(fmt::format("segments: a request of {} B got {} B in a block of {} B", bytes, made.bytes(), made.capacity()));
  return made;
}

void segment_shadow::start_piece(piece& made) {
  made.generation = generation_;
  ++totals.pieces;
  restamp(made);
}

void segment_shadow::check_apart(const piece& made, const std::vector<piece>& others) const {
  const auto at = reinterpret_cast<std::uintptr_t>(made.ref.data());
  const std::uintptr_t end = at + made.ref.capacity();
  const auto apart = [&](const piece& q) {
    if (!q.ref || &q == &made) return;
    const auto from = reinterpret_cast<std::uintptr_t>(q.ref.data());
    if (at < from + q.ref.capacity() && from < end)
      fail(fmt::format("segments: a new piece [{:#x}, {:#x}) overlaps a live one [{:#x}, {:#x})", at, end, from,
                       from + q.ref.capacity()));
  };
  for (const piece& q : pieces_) apart(q);
  for (const piece& q : others) apart(q);
}

void segment_shadow::allocate(int t, std::size_t slot, std::uint64_t h) {
  drop(slot, "before it was replaced");
  piece made;
  made.ref = request(t, sizes[h % std::size(sizes)], stream_of(h >> 8));
  if (!made.ref) return;
  start_piece(made);  // check() looks for overlaps among the slots after the operation
  pieces_[slot] = std::move(made);
}

// A training loop: each step makes the requests of one of the input's four sequences and releases
// them as the sequence says, a few kept past the step (escapes, into the slots). The first sequence
// comes most often, so it becomes a plan (at its second sighting) replayed from an arena; the
// others meet that arena's span idle, so growing the plain path yields it (segment_heap::carve),
// and its next replay holds it again, at home when the pieces left it. The fourth mostly uses two
// streams: then it never becomes a plan.
void segment_shadow::training_loop(int t, std::uint64_t h) {
  if (step_) run_on_(t, [&] { step_.reset(); });
  constexpr std::size_t loop_sizes[] = {4096,    100 * KiB, MiB,      MiB + 1,  3 * MiB,
                                        5 * MiB, 8 * MiB,   12 * MiB, 20 * MiB, 30 * MiB};
  const std::size_t iterations = 3 + h % 4;
  budget_->set_capacity(loop_capacity);  // back to `capacity` after: what is held stays held
  for (std::size_t i = 0; i < iterations; ++i) {
    const std::uint64_t pick = (h >> (8 + 3 * i)) % 8;
    const std::uint64_t sequence = pick < 5 ? 0 : pick - 4;
    const std::uint64_t g = mix(seed_ ^ (0xA5A5ull + sequence));
    const std::size_t count = 3 + g % 10;
    std::vector<piece> live(count);
    std::vector<std::size_t> released_after(count);
    run_on_(t, [&] { step_ = std::make_unique<rp::step>(*cache_); });
    for (std::size_t j = 0; j < count; ++j) {
      const std::uint64_t r = mix(g + j);
      released_after[j] = j + 1 + r % 5;  // past the last request: live until the step's end
      const rp::stream_ref s = stream_of(sequence == 3 && j % 2 == 1 ? 5 : g >> 32);
      live[j].ref = request(t, loop_sizes[(r >> 8) % std::size(loop_sizes)], s);
      if (live[j].ref) {
        check_apart(live[j], live);  // the step's pieces are in no slot: check() does not see them
        start_piece(live[j]);
      }
      for (std::size_t k = 0; k <= j; ++k)
        if (released_after[k] == j && live[k].ref) {
          verify(live[k], "when its step released it");
          if ((r >> 16) % 16 == 0) run_on_(t, [&] { live[k].ref.unsafe_free(); });
          live[k] = piece{};
        }
    }
    for (std::size_t k = 0; k < count; ++k) {
      if (!live[k].ref) continue;
      if (mix(g ^ h ^ k) % 8 == 0) {  // an escape: it stays live past the step
        const std::size_t slot = (k + i) % slots;
        drop(slot, "before an escape replaced it");
        pieces_[slot] = std::move(live[k]);
      } else {
        verify(live[k], "at its step's end");
        live[k] = piece{};
      }
    }
    run_on_(t, [&] { step_.reset(); });
    check(true);
  }
  budget_->set_capacity(capacity);
}

void segment_shadow::drop(std::size_t slot, const char* when) {
  piece& p = pieces_[slot];
  if (!p.ref) return;
  verify(p, when);
  p = piece{};
}

void segment_shadow::step(std::size_t op, int t, std::uint64_t n) {
  spans_.step(op, n);
  const std::uint64_t h = mix(seed_ * 0x100000001B3ull ^ n);
  const std::size_t slot = h % slots;
  piece& p = pieces_[slot];
  switch (op) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 4:
    case 5:
    case 6:
    case 7:  // allocations
      allocate(t, slot, h >> 4);
      break;
    case 8:
    case 9:
    case 10:  // drops, on either thread
      if (p.ref) {
        verify(p, "before its last handle went");
        run_on_(t, [&] { p = piece{}; });
      }
      break;
    case 11:
    case 12:
    case 13: {  // hand a piece to another slot
      const std::size_t to = (slot + 1 + (h >> 20) % (slots - 1)) % slots;
      drop(to, "before it was replaced");
      pieces_[to] = std::move(p);
      p = piece{};
      break;
    }
    case 18:
    case 19:  // unsafe_free
      if (p.ref) {
        verify(p, "before unsafe_free");
        run_on_(t, [&] { p.ref.unsafe_free(); });
        bool threw = false;
        try {
          (void)p.ref.data();
        } catch (const rp::use_after_free&) {
          threw = true;
        }
        if (!threw) fail("segments: data() after unsafe_free did not throw use_after_free");
        p = piece{};
      }
      break;
    case 20:
    case 21:  // a new owner's pattern
      if (p.ref) restamp(p);
      break;
    case 22:
      if (p.ref) p.ref.record_stream(stream_of(h >> 12));
      break;
    case 23:
    case 24:
      if (!step_) step_ = std::make_unique<rp::step>(*cache_);
      break;
    case 26:
    case 27:
    case 28:
      if (step_) run_on_(t, [&] { step_.reset(); });
      break;
    case 25:
    case 29: run_on_(t, [&] { cache_->reclaim(keeps[(h >> 16) % std::size(keeps)]); }); break;
    case 30: run_on_(t, [&] { cache_->set_max_idle_bytes(limits[(h >> 16) % std::size(limits)]); }); break;
    case 31: {
      const auto how = (h >> 16) % 3 == 0 ? rp::failing_resource::failure::backend_error
                                          : rp::failing_resource::failure::out_of_memory;
      failing_->arm(1 + (h >> 20) % 3, 1 + (h >> 24) % 2, how);
      break;
    }
    case 32:
      if ((h >> 16) % 4 == 0) {
        add_totals();
        recreate();
        ++totals.orphaned_caches;
      }
      break;
    case 40:  // one of the harness's planned loops
      training_loop(t, h);
      break;
    case 34:
    case 35:  // a short loop of one size: exact-key hits on the same piece
      for (int i = 0; i < 4; ++i) {
        allocate(t, slot, h >> 4);
        drop(slot, "in a loop");
      }
      break;
    default:  // verify
      for (const piece& q : pieces_)
        if (q.ref) verify(q, "on a verify operation");
      break;
  }
  ++totals.operations;
  check(n % 8 == 7);  // the stats (a barrier on every thread) only every 8 operations
}

void segment_shadow::add_totals() const {
  const rp::cache_stats st = cache_->stats();
  totals.grows += st.segment_grows;
  totals.splits += st.splits;
  totals.merges += st.merges;
  totals.cross_stream += st.cross_stream_reuses;
  totals.plan_recordings += st.plan_recordings;
  totals.plan_hits += st.plan_hits;
  const rp::detail::segment_heap_events spans = rp::detail::access::state(*cache_).spans().span_events();
  totals.span_yields += spans.span_yields;
  totals.span_returns += spans.span_returns;
}

void segment_shadow::check(bool with_stats) {
  // No two live pieces overlap (each slot holds a block of its own: pieces are never copied here).
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> spans;
  // What the handles hold, by the block's owner: the cache's blocks, plan regions (escapes of
  // the training loops), and buffers straight from the backend (a planned run's fallbacks).
  std::size_t live_blocks = 0, live_bytes = 0, region_bytes = 0, direct_bytes = 0;
  bool orphans = false;
  for (const piece& p : pieces_) {
    if (!p.ref) continue;
    const auto at = reinterpret_cast<std::uintptr_t>(p.ref.data());
    spans.emplace_back(at, at + p.ref.capacity());
    if (p.generation != generation_) {
      orphans = true;
      continue;
    }
    switch (origin_of(p.ref)) {
      case rp::detail::block_origin::cached:
        ++live_blocks;
        live_bytes += p.ref.capacity();
        break;
      case rp::detail::block_origin::region: region_bytes += p.ref.capacity(); break;
      case rp::detail::block_origin::direct: direct_bytes += p.ref.capacity(); break;
    }
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second)
      fail(fmt::format("segments: live pieces overlap: [{:#x}, {:#x}) and [{:#x}, {:#x})", spans[i - 1].first,
                       spans[i - 1].second, spans[i].first, spans[i].second));
  if (!with_stats) return;
  // Byte accounting.
  const rp::cache_stats st = cache_->stats();
  const std::size_t out = be_.outstanding_bytes();
  // Arenas are spans of the same heaps: their bytes are segment bytes that no block holds.
  if (st.segment_bytes < st.segment_free_bytes + st.arena_bytes ||
      st.held_bytes != st.segment_bytes - st.segment_free_bytes - st.arena_bytes)
    fail(fmt::format("segments: {} B held in blocks, but the segments hold {} B of which {} B are free and {} B arenas",
                     st.held_bytes, st.segment_bytes, st.segment_free_bytes, st.arena_bytes));
  if (st.reserved_bytes != st.held_bytes + st.segment_free_bytes + st.arena_bytes + st.uncached_live_bytes ||
      st.peak_reserved_bytes < st.reserved_bytes)
    fail(
        fmt::format("segments: reserved {} B (peak {} B) is not held {} B + segment free {} B + arenas {} B + "
                    "uncached {} B",
                    st.reserved_bytes, st.peak_reserved_bytes, st.held_bytes, st.segment_free_bytes, st.arena_bytes,
                    st.uncached_live_bytes));
  if (out != limited_->used())
    fail(fmt::format("segments: the backend has {} B out, its limit adaptor counts {} B", out, limited_->used()));
  if (orphans ? out < st.reserved_bytes : out != st.reserved_bytes)
    fail(
        fmt::format("segments: the backend has {} B out, the cache holds {} B{} (held {} B, segment free {} B, "
                    "arenas {} B, uncached {} B; {} plans, {} dropped, {} arenas replaced)",
                    out, st.reserved_bytes, orphans ? " (and pieces of a destroyed cache)" : "", st.held_bytes,
                    st.segment_free_bytes, st.arena_bytes, st.uncached_live_bytes, st.plans, st.plan_evictions,
                    st.arena_replacements));
  // Escaped regions count in plan_live_bytes (their plan kept or not), not as blocks.
  if (st.live_blocks != live_blocks || st.live_bytes != live_bytes || st.plan_live_bytes != region_bytes ||
      st.uncached_live_bytes != direct_bytes)
    fail(
        fmt::format("segments: the cache counts {} live blocks of {} B, {} B of plan regions and {} B uncached; "
                    "the handles hold {} blocks of {} B, {} B of regions and {} B from the backend",
                    st.live_blocks, st.live_bytes, st.plan_live_bytes, st.uncached_live_bytes, live_blocks, live_bytes,
                    region_bytes, direct_bytes));
  // The heaps' own invariants, and the slots' lists of idle pieces against their buckets.
  try {
    rp::detail::access::state(*cache_).check_segments();
  } catch (const std::logic_error& e) {
    fail(fmt::format("segments: {}", e.what()));
  }
}

void segment_shadow::finish() {
  spans_.finish();
  failing_->disarm();
  for (std::size_t i = 0; i < slots; ++i) drop(i, "at the end");
  step_.reset();
  check(true);
  add_totals();
  cache_.reset();
  if (be_.outstanding_bytes() != 0 || limited_->used() != 0)
    fail(fmt::format("segments: leak: the backend has {} B out after the cache went", be_.outstanding_bytes()));
}

std::string missing_segment_coverage() {
  std::string missing;
  if (totals.plan_recordings == 0) missing += " no plan was made;";
  if (totals.plan_hits == 0) missing += " no region was handed out;";
  if (totals.span_yields == 0) missing += " no arena span yielded;";
  if (totals.span_returns == 0) missing += " no arena held again at home;";
  return missing + missing_span_coverage();
}

void print_segment_totals() {
  fmt::print(stderr,
             "refpool fuzz, cache with segments: {} operations; {} pieces handed out, {} out of memory, {} injected "
             "backend errors, {} caches destroyed with pieces live; segments grown {} times, {} splits, {} merges, "
             "{} cross-stream reuses; plans recorded {}, region hits {}, spans yielded {}, held again at home {}\n",
             totals.operations, totals.pieces, totals.out_of_memory, totals.injected, totals.orphaned_caches,
             totals.grows, totals.splits, totals.merges, totals.cross_stream, totals.plan_recordings, totals.plan_hits,
             totals.span_yields, totals.span_returns);
  print_span_totals();
}

}  // namespace refpool::test::fuzz
