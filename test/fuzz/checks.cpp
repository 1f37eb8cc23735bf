// The checks of refpool against the model: an operation's outcome, the address each request got,
// the owners' byte patterns in live buffers, and after every operation the stats of both caches,
// the backends' bytes outstanding and the state of every handle.
#include <fmt/ranges.h>

#include "session.hpp"

namespace refpool::test::fuzz {

void session::expect(const result& r, outcome want, const char* what) {
  if (r.got != want)
    fail(fmt::format("{}: refpool gave {} ({}), the model expected {}", what, to_string(r.got),
                     r.message.empty() ? "no message" : r.message, to_string(want)));
  if (want != outcome::ok) all.expected_errors += 1;
  if (want == outcome::backend_error && r.native_code != -1)
    fail(fmt::format("{}: backend_error carries native code {}, not the injected -1", what, r.native_code));
}

void session::check_oom(const result& r, std::size_t bytes) {
  if (r.oom_bytes != bytes || r.oom_device != -1)
    fail(fmt::format("out_of_memory reports {} B on device {}, the model expected {} B on device -1", r.oom_bytes,
                     r.oom_device, bytes));
}

void session::fill(void* ptr, std::size_t from, std::size_t bytes, std::uint64_t stamp) {
  auto* p = static_cast<std::uint8_t*>(ptr);
  for (std::size_t i = 0; i < bytes; ++i) p[i] = pattern(stamp, from + i);
}

void session::verify_block(std::uint64_t gid, const char* when) {
  const model_block& b = m_.blocks.at(gid);
  const auto* p = static_cast<const std::uint8_t*>(b.ptr);
  for (std::size_t i = 0; i < b.requested; ++i) {
    if (p[i] != pattern(b.stamp, i)) {
      fail(
          fmt::format("{}: buffer {} ({} B, block {}) lost its owner's pattern at byte {}: another owner wrote it "
                      "(found {:#04x}, expected {:#04x})",
                      when, b.ptr, b.requested, gid, i, p[i], pattern(b.stamp, i)));
    }
  }
}

void session::verify_all(const char* when) {
  for (const auto& [gid, b] : m_.blocks)
    if (b.refs > 0) verify_block(gid, when);
}

void session::pre_drop_verify(int i) {
  const model_handle& h = mh_[i];
  if (h.gid != 0 && m_.blocks.at(h.gid).refs == 1) verify_block(h.gid, "before its last handle went");
}

void session::drop_model(int i) {
  model_handle& h = mh_[i];
  if (h.gid != 0) m_.drop_ref(h.gid, false);
  h = model_handle{};
}

void session::accept_block(std::uint64_t gid, void* got, std::uint64_t stamp, const char* what) {
  model_block& b = m_.blocks.at(gid);
  trace("  -> {} (model: block {} at {})", got, gid, b.ptr);
  if (got != b.ptr) {
    std::string whose = "no block the model knows";
    for (const auto& [g, other] : m_.blocks) {
      if (got >= other.ptr && static_cast<char*>(got) < static_cast<char*>(other.ptr) + other.capacity)
        whose = other.refs > 0 && g != gid
                    ? fmt::format("block {}, which is LIVE with {} handles: one buffer, two owners", g, other.refs)
                    : fmt::format("block {} ({})", g, other.idle ? "idle, but not the one the rules pick" : "not idle");
    }
    fail(fmt::format("{}: refpool returned {} ({}); the model expected block {} at {}", what, got, whose, gid, b.ptr));
  }
  b.stamp = stamp;
}

void session::check_handle(int i) {
  const model_handle& m = mh_[i];
  if (static_cast<int>(h_[i].index()) != m.kind)
    fail(fmt::format("handle {} holds alternative {}, the model expected {}", i, h_[i].index(), m.kind));
  const model_block* b = m.gid != 0 ? &m_.blocks.at(m.gid) : nullptr;
  const long refs = b != nullptr ? b->refs : 0;
  std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, std::monostate>) {
          return;
        } else {
          if (x.is_freed() != m.freed || x.use_count() != refs)
            fail(fmt::format("handle {}: is_freed {} use_count {}, the model expected {} and {}", i, x.is_freed(),
                             x.use_count(), m.freed, refs));
          if constexpr (std::is_same_v<X, rp::data_ref>) {
            if (static_cast<bool>(x) != (b != nullptr)) fail(fmt::format("handle {}: data_ref null-ness differs", i));
            if (!m.freed && b != nullptr &&
                (x.data() != b->ptr || x.bytes() != b->requested || x.capacity() != b->capacity ||
                 x.stream().handle != b->last_stream || x.source() != be_[b->backend]))
              fail(
                  fmt::format("handle {}: data_ref reports {} {} B (capacity {} B, stream {}), the model expected {} "
                              "{} B (capacity {} B, stream {})",
                              i, x.data(), x.bytes(), x.capacity(), x.stream().handle, b->ptr, b->requested,
                              b->capacity, b->last_stream));
          } else {
            using T = typename X::value_type;
            const std::vector<std::size_t> dims(x.dims().begin(), x.dims().end());
            if (x.size() != m.size || x.offset() != m.offset || dims != m.dims || x.bytes() != m.size * sizeof(T))
              fail(
                  fmt::format("handle {}: array of {} elements at offset {} dims {}, the model expected {} at {} dims "
                              "{}",
                              i, x.size(), x.offset(), dims, m.size, m.offset, m.dims));
            if (!m.freed) {
              const void* want =
                  b != nullptr && m.size != 0 ? static_cast<char*>(b->ptr) + m.offset * sizeof(T) : nullptr;
              if (x.data() != want)
                fail(fmt::format("handle {}: data() is {}, the model expected {}", i, fmt::ptr(x.data()), want));
            }
          }
        }
      },
      h_[i]);
}

void session::check_all() {
  m_.expect_no_more_events("after the operation");
  std::size_t held = 0;
  for (int c = 0; c < 2; ++c) {
    const rp::cache_stats real = cache_[c]->stats();
    const rp::cache_stats want = m_.stats(cur_[c]);
    std::string diffs;
#define REFPOOL_FUZZ_FIELD(f) \
  if (real.f != want.f) diffs += fmt::format(" {}: refpool {}, model {};", #f, real.f, want.f);
    REFPOOL_FUZZ_FIELD(hits)
    REFPOOL_FUZZ_FIELD(misses)
    REFPOOL_FUZZ_FIELD(steals)
    REFPOOL_FUZZ_FIELD(backend_allocations)
    REFPOOL_FUZZ_FIELD(backend_frees)
    REFPOOL_FUZZ_FIELD(unsafe_frees)
    REFPOOL_FUZZ_FIELD(escapes)
    REFPOOL_FUZZ_FIELD(evictions)
    REFPOOL_FUZZ_FIELD(reclaimed_blocks)
    REFPOOL_FUZZ_FIELD(oom_retries)
    REFPOOL_FUZZ_FIELD(cross_stream_reuses)
    REFPOOL_FUZZ_FIELD(scope_entries)
    REFPOOL_FUZZ_FIELD(uncached_entries)
    REFPOOL_FUZZ_FIELD(live_blocks)
    REFPOOL_FUZZ_FIELD(idle_blocks)
    REFPOOL_FUZZ_FIELD(live_bytes)
    REFPOOL_FUZZ_FIELD(idle_bytes)
    REFPOOL_FUZZ_FIELD(held_bytes)
    REFPOOL_FUZZ_FIELD(peak_held_bytes)
    REFPOOL_FUZZ_FIELD(ooms)
    REFPOOL_FUZZ_FIELD(steps)
    REFPOOL_FUZZ_FIELD(uncached_allocations)
    REFPOOL_FUZZ_FIELD(uncached_live_bytes)
    REFPOOL_FUZZ_FIELD(plan_hits)
    REFPOOL_FUZZ_FIELD(plan_misses)
    REFPOOL_FUZZ_FIELD(plan_recordings)
    REFPOOL_FUZZ_FIELD(plans)
    REFPOOL_FUZZ_FIELD(arena_bytes)
    REFPOOL_FUZZ_FIELD(planned_peak_live_bytes)
    REFPOOL_FUZZ_FIELD(plan_evictions)
    REFPOOL_FUZZ_FIELD(plan_pauses)
    REFPOOL_FUZZ_FIELD(plan_unrecorded_runs)
    REFPOOL_FUZZ_FIELD(plan_busy_runs)
    REFPOOL_FUZZ_FIELD(plan_pass_runs)
    REFPOOL_FUZZ_FIELD(plan_probe_runs)
    REFPOOL_FUZZ_FIELD(plan_pass_entries)
    REFPOOL_FUZZ_FIELD(arena_growths)
    REFPOOL_FUZZ_FIELD(arena_replacements)
    REFPOOL_FUZZ_FIELD(plan_live_bytes)
    REFPOOL_FUZZ_FIELD(allocated_bytes)
    REFPOOL_FUZZ_FIELD(reserved_bytes)
#undef REFPOOL_FUZZ_FIELD
    if (!diffs.empty()) fail(fmt::format("stats of cache {} differ:{}", c, diffs));
    if (real.peak_allocated_bytes < real.allocated_bytes || real.peak_allocated_bytes > real.peak_reserved_bytes)
      fail(fmt::format("cache {}: peak allocated {} B is below allocated {} B or above peak reserved {} B", c,
                       real.peak_allocated_bytes, real.allocated_bytes, real.peak_reserved_bytes));
    if (real.held_bytes != real.live_bytes + real.idle_bytes)
      fail(fmt::format("cache {}: held {} B is not live {} B + idle {} B", c, real.held_bytes, real.live_bytes,
                       real.idle_bytes));
    held += real.held_bytes;
  }
  // No leak: what the backends have out is what the caches hold, plus live uncached buffers,
  // plus live buffers of destroyed caches.
  std::size_t outstanding = 0;
  for (int b = 0; b < backends; ++b) {
    const std::size_t real = be_[b].outstanding_bytes();
    if (real != m_.be[b].outstanding || real != m_.allocated_bytes(b) || real != limited_[b]->used() ||
        failing_[b]->calls() != m_.be[b].calls)
      fail(
          fmt::format("backend {}: {} B outstanding (limit adaptor {} B, {} calls since arm), the model expected {} B "
                      "({} calls)",
                      b, real, limited_[b]->used(), failing_[b]->calls(), m_.be[b].outstanding, m_.be[b].calls));
    outstanding += real;
  }
  // ... plus arenas of plans.
  std::size_t elsewhere = 0;
  for (const auto& [gid, b] : m_.blocks) {
    if (b.kind == block_kind::region) continue;  // inside an arena
    if (b.kind != block_kind::cached || m_.caches[static_cast<std::size_t>(b.cache)].closed) elsewhere += b.capacity;
  }
  for (int b = 0; b < backends; ++b) elsewhere += m_.arena_bytes(b);
  if (outstanding != held + elsewhere)
    fail(fmt::format("backends have {} B outstanding, but the caches hold {} B and uncached or orphaned buffers {} B",
                     outstanding, held, elsewhere));
  for (int i = 0; i < handle_count; ++i) check_handle(i);
}

void session::op_verify(int) { verify_all("periodic check"); }

}  // namespace refpool::test::fuzz
