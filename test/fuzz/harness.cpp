// The fuzz harness: decodes input bytes into operations, runs each on the main or the helper
// thread (one at a time, so results are deterministic), and compares refpool with the model
// after every operation: results and exception types, the address each allocation got (a block,
// or a region of a plan), every backend call, all stats of both caches (plan counters included),
// backend bytes outstanding, and the state of every handle. Every live buffer carries its owner's
// byte pattern, checked before it is dropped and every 16 operations, so a buffer handed to two
// owners would show the other owner's bytes. Planned scopes and steps run under a few keys, so
// recordings, replays, divergences, several plans per key and busy arenas all happen. Buffers are
// also handed to the pointer table and freed by address (twice, at times: a double free).
#include "harness.hpp"

#include <cstring>

#include <fmt/ranges.h>

#include <refpool/pointer.hpp>
#include <refpool/testing.hpp>

#include "session.hpp"

namespace refpool::test::fuzz {

totals all;
bool tracing = std::getenv("REFPOOL_FUZZ_TRACE") != nullptr;
int op_thread = 0;

namespace {

std::vector<std::uint8_t> current_input;  // the input being run, for REFPOOL_FUZZ_KEEP
std::uint64_t op_index = 0;
std::size_t op_code = 0;  // which operation of the table; -1: setup and cleanup
bool in_cleanup = false;

}  // namespace

helper_thread& helper() {
  static helper_thread instance;
  return instance;
}

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

std::vector<std::size_t> session::make_dims(std::size_t count) {
  std::vector<std::size_t> dims;
  if (count == 0) {
    const std::size_t rank = 1 + in_.below(3);
    for (std::size_t i = 0; i < rank; ++i) dims.push_back(in_.below(5));
    dims[in_.below(rank)] = 0;
    return dims;
  }
  std::size_t rank = in_.below(5);
  if (rank == 0 && count != 1) rank = 1;
  std::size_t rest = count;
  for (std::size_t k = 0; k + 1 < rank; ++k) {
    std::size_t divisors[64];
    std::size_t n = 0;
    for (std::size_t d = 1; d <= rest && n < 64; ++d)
      if (rest % d == 0) divisors[n++] = d;
    const std::size_t d = divisors[in_.below(n)];
    dims.push_back(d);
    rest /= d;
  }
  if (rank > 0) dims.push_back(rest);
  return dims;
}

std::vector<std::size_t> session::overflow_dims() {
  switch (in_.below(3)) {
    case 0: return {huge / 2 + 1, 3};
    case 1: return {std::size_t{1} << 33, std::size_t{1} << 33};
    default: return {huge, 2, 1};
  }
}

// ---- buffers and their owners' patterns ---------------------------------------------------

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

// ---- checks after each operation ----------------------------------------------------------

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
    REFPOOL_FUZZ_FIELD(arena_growths)
    REFPOOL_FUZZ_FIELD(arena_replacements)
    REFPOOL_FUZZ_FIELD(plan_live_bytes)
    REFPOOL_FUZZ_FIELD(allocated_bytes)
    REFPOOL_FUZZ_FIELD(reserved_bytes)
#undef REFPOOL_FUZZ_FIELD
    if (!diffs.empty()) fail(fmt::format("stats of cache {} differ:{}", c, diffs));
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

// ---- setup --------------------------------------------------------------------------------

void session::make_backends() {
  constexpr std::size_t small[] = {2048, 4096, 8192, 16384, 65536};
  const std::size_t caps[backends] = {backend0_capacity, small[in_.below(std::size(small))]};
  for (int b = 0; b < backends; ++b) {
    limited_[b] = std::make_shared<rp::limiting_resource>(rp::make_host_resource(), caps[b]);
    failing_[b] = std::make_shared<rp::failing_resource>(limited_[b]);
    be_[b] = rp::backend(std::make_shared<tracking_resource>(failing_[b], b, log_, gate_));
    m_.be[b].capacity = caps[b];
  }
}

rp::cache_options session::decode_options(int t, model_rounding& rounding) {
  rp::cache_options options;
  const std::size_t choice = in_.below(12);
  rounding = {};
  switch (choice) {
    case 0:
    case 1:
    case 2:
    case 3: break;
    case 4: rounding = {model_rounding::mode::step, 8}; break;
    case 5: rounding = {model_rounding::mode::step, 64}; break;
    case 6: rounding = {model_rounding::mode::step, 100}; break;
    case 7: rounding = {model_rounding::mode::step, 512}; break;
    case 8: rounding = {model_rounding::mode::pow2, 1}; break;
    case 9: rounding = {model_rounding::mode::pow2, 2}; break;
    case 10: rounding = {model_rounding::mode::pow2, 4}; break;
    default: {  // a bad policy first: config_error, then exact
      const std::size_t bad = in_.below(4);
      const result r = on(t, [&] {
        if (bad == 0) (void)rp::rounding_policy::step(0);
        if (bad == 1) (void)rp::rounding_policy::pow2(0);
        if (bad == 2) (void)rp::rounding_policy::pow2(3);
        if (bad == 3) (void)rp::rounding_policy::pow2(128);
      });
      expect(r, outcome::config_error, "a bad rounding policy");
      break;
    }
  }
  if (rounding.how == model_rounding::mode::step) options.rounding = rp::rounding_policy::step(rounding.parameter);
  if (rounding.how == model_rounding::mode::pow2)
    options.rounding = rp::rounding_policy::pow2(static_cast<unsigned>(rounding.parameter));
  options.max_idle_bytes = limits[in_.below(std::size(limits))];
  return options;
}

// ---- operations ---------------------------------------------------------------------------

void session::op_alloc(int t) {
  const int hi = pick_handle();
  const std::size_t pick = in_.below(2 * type_count);  // half the requests are floats
  const int type = pick < type_count ? static_cast<int>(pick) : 2;
  const int b = pick_backend();
  const std::vector<std::size_t> dims = make_dims(pick_count());
  void* stream = pick_stream();
  const std::uint64_t stamp = next_stamp();
  trace("empty<{}>({}, backend {}, stream {}) -> handle {}", type_name[type], dims, b, stream, hi);
  pre_drop_verify(hi);
  void* got = nullptr;
  const result r = on(t, [&] {
    with_type(type, [&]<class T>() {
      auto a = rp::empty<T>(be_[b], to_shape(dims), rp::stream_ref{stream});
      got = a.data();
      if (got != nullptr) fill(got, 0, a.bytes(), stamp);
      h_[hi] = std::move(a);
    });
  });
  std::size_t count = 0, bytes = 0, oom = 0;
  std::uint64_t gid = 0;
  outcome want = checked_bytes(dims, elem_size[type], count, bytes);
  if (want == outcome::ok && bytes > 0) want = m_.allocate(t, b, bytes, stream, gid, oom);
  expect(r, want, "empty<T>");
  if (want == outcome::out_of_memory) check_oom(r, oom);
  if (want != outcome::ok) return;
  if (gid != 0) {
    accept_block(gid, got, stamp, "empty<T>");
  } else if (got != nullptr) {
    fail("a zero-element array has a buffer");
  }
  drop_model(hi);
  mh_[hi] = {type + 1, gid, false, nullptr, 0, count, 0, dims};
}

void session::op_alloc_raw(int t) {
  const int hi = pick_handle();
  const int b = pick_backend();
  const std::size_t bytes = raw_sizes[in_.below(std::size(raw_sizes))];
  void* stream = pick_stream();
  const std::uint64_t stamp = next_stamp();
  trace("allocate({} B, backend {}, stream {}) -> handle {}", bytes, b, stream, hi);
  pre_drop_verify(hi);
  void* got = nullptr;
  const result r = on(t, [&] {
    rp::data_ref ref = rp::allocate(be_[b], bytes, rp::stream_ref{stream});
    got = ref.data();
    fill(got, 0, bytes, stamp);
    h_[hi] = std::move(ref);
  });
  std::uint64_t gid = 0;
  std::size_t oom = 0;
  const outcome want = m_.allocate(t, b, bytes, stream, gid, oom);
  expect(r, want, "allocate");
  if (want == outcome::out_of_memory) check_oom(r, oom);
  if (want != outcome::ok) return;
  accept_block(gid, got, stamp, "allocate");
  drop_model(hi);
  mh_[hi] = model_handle{};
  mh_[hi].kind = ref_kind;
  mh_[hi].gid = gid;
}

// Edge requests: zero bytes (a null handle, no allocation), and requests that must fail:
// overflowing dims, a null backend, more than the backend has.
void session::op_alloc_misuse(int t) {
  const int b = in_.byte() & 1;
  const std::size_t kind = in_.below(4);
  if (kind == 0) {
    trace("allocate(0 B)");
    bool null_handle = false;
    expect(on(t,
              [&] {
                const rp::data_ref zero = rp::allocate(be_[b], 0);
                null_handle = !zero && zero.data() == nullptr && zero.bytes() == 0 && zero.use_count() == 0;
              }),
           outcome::ok, "allocate(0 bytes)");
    if (!null_handle) fail("allocate(0 bytes) did not give a null handle");
  } else if (kind == 1) {
    const int type = static_cast<int>(in_.below(type_count));
    const std::vector<std::size_t> dims = overflow_dims();
    trace("empty<{}>({}) overflowing", type_name[type], dims);
    expect(on(t, [&] { with_type(type, [&]<class T>() { (void)rp::empty<T>(be_[b], to_shape(dims)); }); }),
           outcome::size_error, "empty<T> with overflowing dims");
  } else if (kind == 2) {
    trace("allocate from a null backend");
    expect(on(t, [&] { (void)rp::allocate(rp::backend{}, 8); }), outcome::invalid_argument,
           "allocate from a null backend");
  } else {
    const std::size_t sizes[] = {m_.be[b].capacity + 1, huge / 2, huge - 7, huge};
    const std::size_t bytes = sizes[in_.below(4)];
    trace("allocate({} B) on backend {}: more than it has", bytes, b);
    const result r = on(t, [&] { (void)rp::allocate(be_[b], bytes); });
    std::uint64_t gid = 0;
    std::size_t oom = 0;
    const outcome want = m_.allocate(t, b, bytes, nullptr, gid, oom);
    if (want == outcome::ok) fail("the model let a request larger than the backend succeed");
    expect(r, want, "allocate more than the backend has");
    if (want == outcome::out_of_memory) check_oom(r, oom);
  }
}

void session::op_drop(int t) {
  const int hi = pick_handle();
  trace("drop handle {}", hi);
  pre_drop_verify(hi);
  expect(on(t, [&] { h_[hi] = std::monostate{}; }), outcome::ok, "drop");
  drop_model(hi);
}

void session::op_copy(int t) {
  const int a = pick_handle();
  const int b = pick_handle();
  trace("handle {} = copy of handle {}", b, a);
  pre_drop_verify(b);
  const result r = on(t, [&] {
    handle copy = h_[a];  // throws before handle b changes
    h_[b] = std::move(copy);
  });
  const model_handle source = mh_[a];
  expect(r, source.freed ? outcome::use_after_free : outcome::ok, "copy");
  if (source.freed) {
    if (r.message.find(fmt::format("{}", source.freed_ptr)) == std::string::npos)
      fail(fmt::format("use_after_free does not name the buffer {}: {}", source.freed_ptr, r.message));
    return;
  }
  if (source.gid != 0) m_.add_ref(source.gid);
  drop_model(b);
  mh_[b] = source;
}

void session::op_move(int t) {
  const int a = pick_handle();
  int b = pick_handle();
  if (b == a) b = (a + 1) % handle_count;
  trace("handle {} = move(handle {})", b, a);
  pre_drop_verify(b);
  expect(on(t, [&] { h_[b] = std::move(h_[a]); }), outcome::ok, "move");
  const model_handle moved = mh_[a];
  drop_model(b);
  mh_[b] = moved;
  mh_[a] = model_handle{};
  mh_[a].kind = moved.kind;  // a moved-from array or data_ref is empty: no buffer, no elements
}

void session::op_ref_out(int t) {
  const int a = pick_handle();
  const int b = pick_handle();
  if (mh_[a].kind == 0) return;
  trace("handle {} = data_ref of handle {}", b, a);
  pre_drop_verify(b);
  const result r = on(t, [&] {
    rp::data_ref ref = ref_of(h_[a]);
    h_[b] = std::move(ref);
  });
  const model_handle source = mh_[a];
  expect(r, source.freed ? outcome::use_after_free : outcome::ok, "data_ref copy");
  if (source.freed) return;
  if (source.gid != 0) m_.add_ref(source.gid);
  drop_model(b);
  mh_[b] = model_handle{};
  mh_[b].kind = ref_kind;
  mh_[b].gid = source.gid;
}

void session::op_reshape(int t) {
  const int a = pick_handle();
  const int b = pick_handle();
  const model_handle source = mh_[a];
  if (source.kind < 1 || source.kind > type_count) return;
  const int type = source.kind - 1;
  std::vector<std::size_t> dims;
  const std::size_t how = in_.below(8);
  if (how < 6) {
    dims = make_dims(source.size);
  } else if (how == 6) {
    std::size_t count = pick_count();
    if (count == source.size) count += 1;
    dims = make_dims(count);
  } else {
    dims = overflow_dims();
  }
  trace("handle {} = handle {}.reshape({})", b, a, dims);
  pre_drop_verify(b);
  const result r = on(t, [&] {
    with_type(type, [&]<class T>() {
      auto out = std::get<rp::array<T>>(h_[a]).reshape(to_shape(dims));
      h_[b] = std::move(out);
    });
  });
  std::size_t count = 0, bytes = 0;
  outcome want = checked_bytes(dims, 1, count, bytes);
  if (want == outcome::ok && count != source.size) want = outcome::shape_error;
  if (want == outcome::ok && source.freed) want = outcome::use_after_free;
  expect(r, want, "reshape");
  if (want != outcome::ok) return;
  if (source.gid != 0) m_.add_ref(source.gid);
  drop_model(b);
  mh_[b] = {source.kind, source.gid, false, nullptr, 0, source.size, source.offset, dims};
}

void session::op_reinterpret(int t) {
  const int a = pick_handle();
  const int b = pick_handle();
  const model_handle source = mh_[a];
  if (source.kind < 1 || source.kind > type_count) return;
  const int from = source.kind - 1;
  const int to = static_cast<int>(in_.below(type_count));
  const std::size_t src_bytes = source.size * elem_size[from];
  const bool keep_dims = in_.below(4) == 0;  // reinterpret<U>() without dims
  std::vector<std::size_t> dims;
  if (keep_dims) {
    dims = elem_size[to] == elem_size[from] ? source.dims : std::vector<std::size_t>{src_bytes / elem_size[to]};
  } else {
    const std::size_t how = in_.below(8);
    if (how < 6 && src_bytes % elem_size[to] == 0) {
      dims = make_dims(src_bytes / elem_size[to]);
    } else if (how < 7) {
      dims = make_dims(pick_count());
    } else {
      dims = overflow_dims();
    }
  }
  trace("handle {} = handle {}.reinterpret<{}>({}{})", b, a, type_name[to], keep_dims ? "kept or flat: " : "", dims);
  pre_drop_verify(b);
  const result r = on(t, [&] {
    with_type(from, [&]<class T>() {
      with_type(to, [&]<class U>() {
        const auto& x = std::get<rp::array<T>>(h_[a]);
        auto out = keep_dims ? x.template reinterpret<U>() : x.template reinterpret<U>(to_shape(dims));
        h_[b] = std::move(out);
      });
    });
  });
  std::size_t count = 0, bytes = 0;
  outcome want = checked_bytes(dims, elem_size[to], count, bytes);
  const std::size_t byte_offset = source.offset * elem_size[from];
  if (want == outcome::ok && bytes != src_bytes) want = outcome::shape_error;
  if (want == outcome::ok && (byte_offset % elem_size[to] != 0 || byte_offset % elem_align[to] != 0))
    want = outcome::shape_error;
  if (want == outcome::ok && source.freed) want = outcome::use_after_free;
  expect(r, want, "reinterpret");
  if (want != outcome::ok) return;
  if (source.gid != 0) m_.add_ref(source.gid);
  drop_model(b);
  mh_[b] = {to + 1, source.gid, false, nullptr, 0, count, byte_offset / elem_size[to], dims};
}

// array<U>(ref, dims, offset): a view over another handle's buffer, by copy or by move.
void session::op_view(int t) {
  const int a = pick_handle();
  const int b = pick_handle();
  const model_handle source = mh_[a];
  if (source.kind == 0) return;
  const int to = static_cast<int>(in_.below(type_count));
  const bool by_move = source.kind == ref_kind && in_.below(4) == 0;
  const std::size_t buffer = source.gid != 0 ? m_.blocks.at(source.gid).requested : 0;
  const std::size_t fits = buffer / elem_size[to];
  std::vector<std::size_t> dims;
  std::size_t offset = 0;
  const std::size_t how = in_.below(8);
  if (how < 5) {
    const std::size_t count = in_.below(fits + 1);
    offset = in_.below(fits - count + 1);
    dims = make_dims(count);
  } else if (how == 5) {
    const std::size_t count = 1 + in_.below(8);
    offset = fits - std::min(fits, count) + 1 + in_.below(3);  // one past what fits, or more
    dims = make_dims(count);
  } else if (how == 6) {
    offset = huge - in_.below(2);
    dims = make_dims(in_.below(2) == 0 ? 0 : 1 + in_.below(4));
  } else {
    dims = overflow_dims();
  }
  trace("handle {} = array<{}>({}handle {}, {}, offset {})", b, type_name[to], by_move ? "move of " : "", a, dims,
        offset);
  pre_drop_verify(b);
  if (by_move) pre_drop_verify(a);
  const result r = on(t, [&] {
    with_type(to, [&]<class U>() {
      if (by_move) {
        rp::array<U> view(std::move(std::get<rp::data_ref>(h_[a])), to_shape(dims), offset);
        h_[b] = std::move(view);
      } else {
        rp::array<U> view(ref_of(h_[a]), to_shape(dims), offset);
        h_[b] = std::move(view);
      }
    });
  });
  std::size_t count = 0, bytes = 0;
  outcome want = source.freed ? outcome::use_after_free : checked_bytes(dims, elem_size[to], count, bytes);
  if (want == outcome::ok && count != 0) {
    std::size_t end = 0, end_bytes = 0;
    if (__builtin_add_overflow(offset, count, &end) || __builtin_mul_overflow(end, elem_size[to], &end_bytes) ||
        end_bytes > buffer)
      want = outcome::shape_error;
  }
  if (by_move) {  // moved into the constructor's parameter
    mh_[a] = model_handle{};
    mh_[a].kind = ref_kind;
  }
  expect(r, want, by_move ? "array view over a moved data_ref" : "array view over a data_ref");
  // A view of zero elements owns no buffer (array.hpp); a failed one dropped what it was given.
  const bool keeps_ref = want == outcome::ok && count != 0;
  if (keeps_ref && !by_move && source.gid != 0) m_.add_ref(source.gid);
  if (!keeps_ref && by_move && source.gid != 0) m_.drop_ref(source.gid, false);
  if (want != outcome::ok) return;
  drop_model(b);
  mh_[b] = {to + 1, keeps_ref ? source.gid : 0, false, nullptr, 0, count, offset, dims};
}

void session::op_unsafe_free(int t) {
  const int hi = pick_handle();
  const bool twice = in_.below(4) == 0;
  trace("handle {}.unsafe_free(){}", hi, twice ? " twice" : "");
  pre_drop_verify(hi);
  expect(on(t,
            [&] {
              std::visit(
                  [&](auto& x) {
                    if constexpr (!std::is_same_v<std::decay_t<decltype(x)>, std::monostate>) {
                      x.unsafe_free();
                      if (twice) x.unsafe_free();  // idempotent: no double free
                    }
                  },
                  h_[hi]);
            }),
         outcome::ok, "unsafe_free");
  model_handle& m = mh_[hi];
  if (m.gid == 0 || m.freed) return;
  const model_block& b = m_.blocks.at(m.gid);
  m.freed = true;
  m.freed_ptr = b.ptr;
  m.freed_bytes = b.requested;
  const std::uint64_t gid = std::exchange(m.gid, 0);
  m_.drop_ref(gid, true);
}

// Access through a handle after unsafe_free: each way must throw use_after_free naming the buffer.
void session::op_access(int t) {
  const int hi = pick_handle();
  const model_handle m = mh_[hi];
  if (!m.freed) {
    // Live handles: data() and friends from this thread (check_handle compares the values).
    expect(on(t,
              [&] {
                std::visit(
                    [](const auto& x) {
                      if constexpr (!std::is_same_v<std::decay_t<decltype(x)>, std::monostate>) (void)x.data();
                    },
                    h_[hi]);
              }),
           outcome::ok, "data() on a live handle");
    return;
  }
  const std::size_t way = in_.below(8);
  trace("access {} to handle {} after unsafe_free", way, hi);
  const result r = on(t, [&] {
    std::visit(
        [&](const auto& x) {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<X, rp::data_ref>) {
            switch (way) {
              case 0: (void)x.data(); break;
              case 1: (void)x.bytes(); break;
              case 2: (void)x.capacity(); break;
              case 3: (void)x.source(); break;
              case 4: (void)x.stream(); break;
              case 5: {
                rp::data_ref copy(x);
                break;
              }
              case 6: {
                rp::data_ref target;
                target = x;
                break;
              }
              default: x.record_stream({}); break;
            }
          } else if constexpr (!std::is_same_v<X, std::monostate>) {
            switch (way) {
              case 0: (void)x.data(); break;
              case 1: (void)x.reshape(x.dims()); break;
              case 2: {
                X copy(x);
                break;
              }
              case 3: (void)x.template reinterpret<std::uint8_t>(); break;
              case 4: x.record_stream({}); break;
              case 5: (void)x.ref().data(); break;
              case 6: {
                X view(x.ref(), x.dims(), x.offset());
                break;
              }
              default: {
                X target;
                target = x;
                break;
              }
            }
          }
        },
        h_[hi]);
  });
  expect(r, outcome::use_after_free, "access after unsafe_free");
  if (r.message.find(fmt::format("{}", m.freed_ptr)) == std::string::npos ||
      r.message.find(fmt::format("({} B)", m.freed_bytes)) == std::string::npos)
    fail(fmt::format("use_after_free does not name the buffer {} ({} B): {}", m.freed_ptr, m.freed_bytes, r.message));
}

void session::op_write(int t) {
  const int hi = pick_handle();
  const model_handle& m = mh_[hi];
  if (m.gid == 0) return;
  const model_block& b = m_.blocks.at(m.gid);
  trace("write handle {} (block {})", hi, m.gid);
  expect(on(t,
            [&] {
              std::visit(
                  [&](const auto& x) {
                    using X = std::decay_t<decltype(x)>;
                    if constexpr (std::is_same_v<X, rp::data_ref>) {
                      fill(x.data(), 0, x.bytes(), b.stamp);
                    } else if constexpr (!std::is_same_v<X, std::monostate>) {
                      using T = typename X::value_type;
                      fill(x.data(), x.offset() * sizeof(T), x.bytes(), b.stamp);
                    }
                  },
                  h_[hi]);
            }),
         outcome::ok, "write");
  verify_block(m.gid, "after a write through one of its views");
}

void session::op_record_stream(int t) {
  const int hi = pick_handle();
  void* stream = pick_stream();
  trace("handle {}.record_stream({})", hi, stream);
  const result r = on(t, [&] {
    std::visit(
        [&](const auto& x) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(x)>, std::monostate>) x.record_stream({stream});
        },
        h_[hi]);
  });
  const model_handle& m = mh_[hi];
  expect(r, m.freed ? outcome::use_after_free : outcome::ok, "record_stream");
  if (m.gid != 0) m_.record_stream(m.gid, stream);
}

void session::op_scope(int t) {
  const int c = in_.byte() & 1;
  const std::size_t warmup = in_.below(8) == 0 ? 1 + in_.below(2) : 0;
  const std::string key = pick_key();
  if (frames_[t].size() >= max_depth) return op_close(t);
  trace("thread {}: scope on cache {} (warm-up {}{}{})", t, c, warmup, key.empty() ? "" : ", plan ", key);
  bool caching = false, active = false;
  expect(on(t,
            [&] {
              real_frame f;
              f.scope = std::make_unique<rp::scope>(*cache_[c], rp::scope_options{warmup, key});
              caching = f.scope->caching();
              active = rp::caching_active();
              frames_[t].push_back(std::move(f));
            }),
         outcome::ok, "scope");
  m_.enter_scope(t, cur_[c], warmup, key);
  const bool want = m_.frames[t].back().lease >= 0;
  if (caching != want || active != want)
    fail(fmt::format("scope::caching() {} caching_active() {}, the model expected {}", caching, active, want));
}

// Opens a step on a cache (planned or not, sometimes a warm-up step), or ends the open one, on
// either thread. A second step on one cache is a scope_error.
void session::op_step(int t) {
  const int c = in_.byte() & 1;
  if (!old_steps_.empty() && in_.below(4) == 0) {
    trace("thread {}: end a step of a destroyed cache", t);
    expect(on(t, [&] { old_steps_.front().first->end(); }), outcome::ok, "step end after its cache");
    m_.end_step(old_steps_.front().second);
    old_steps_.erase(old_steps_.begin());
    return;
  }
  if (open_steps_[c] && in_.below(4) != 0) {
    trace("thread {}: end the step of cache {}", t, c);
    expect(on(t,
              [&] {
                open_steps_[c]->end();
                open_steps_[c]->end();  // idempotent
                open_steps_[c].reset();
              }),
           outcome::ok, "step end");
    m_.end_step(step_cache_[c]);
    step_cache_[c] = -1;
    return;
  }
  const std::size_t warmup = in_.below(8) == 0 ? 1 + in_.below(3) : 0;
  const std::string key = pick_key();
  trace("thread {}: step on cache {} (warm-up {}{}{})", t, c, warmup, key.empty() ? "" : ", plan ", key);
  std::unique_ptr<rp::step> made;
  const result r = on(t, [&] { made = std::make_unique<rp::step>(*cache_[c], rp::scope_options{warmup, key}); });
  const outcome want = m_.open_step(cur_[c], warmup, key);
  expect(r, want, open_steps_[c] ? "a second step on one cache" : "step");
  if (want != outcome::ok) return;
  if (open_steps_[c]) fail("model: a step opened where one was open");
  open_steps_[c] = std::move(made);
  step_cache_[c] = cur_[c];
}

// alloc_cache::allocate: the calling thread's cache-level slot, or the open step's plan.
void session::op_cache_alloc(int t) {
  const int c = loop_cache_ >= 0 ? (in_.byte(), loop_cache_) : in_.byte() & 1;
  const int hi = pick_handle();
  const int b = pick_backend();
  const std::size_t bytes = in_.below(8) == 0 ? 0 : raw_sizes[in_.below(std::size(raw_sizes))];
  void* stream = pick_stream();
  const std::uint64_t stamp = next_stamp();
  trace("cache {}.allocate({} B, backend {}, stream {}) -> handle {}", c, bytes, b, stream, hi);
  pre_drop_verify(hi);
  void* got = nullptr;
  const result r = on(t, [&] {
    rp::data_ref ref = cache_[c]->allocate(be_[b], bytes, rp::stream_ref{stream});
    got = ref.data();
    if (got != nullptr) fill(got, 0, bytes, stamp);
    h_[hi] = std::move(ref);
  });
  std::uint64_t gid = 0;
  std::size_t oom = 0;
  const outcome want = bytes == 0 ? outcome::ok : m_.cache_allocate(t, cur_[c], b, bytes, stream, gid, oom);
  all.cache_level += 1;
  expect(r, want, "alloc_cache::allocate");
  if (want == outcome::out_of_memory) check_oom(r, oom);
  if (want != outcome::ok) return;
  if (bytes == 0 && got != nullptr) fail("a zero-byte request got a buffer");
  if (gid != 0) accept_block(gid, got, stamp, "alloc_cache::allocate");
  drop_model(hi);
  mh_[hi] = model_handle{};
  mh_[hi].kind = ref_kind;
  mh_[hi].gid = gid;
}

void session::op_guard(int t) {
  if (frames_[t].size() >= max_depth) return op_close(t);
  trace("thread {}: uncached_guard", t);
  bool active = true;
  expect(on(t,
            [&] {
              real_frame f;
              f.guard = std::make_unique<rp::uncached_guard>();
              active = rp::caching_active();
              frames_[t].push_back(std::move(f));
            }),
         outcome::ok, "uncached_guard");
  m_.enter_guard(t);
  if (active) fail("caching_active() inside an uncached_guard");
}

void session::op_close(int t) {
  if (frames_[t].empty()) return;
  trace("thread {}: close its innermost {}", t, m_.frames[t].back().guard ? "guard" : "scope");
  bool active = false;
  expect(on(t,
            [&] {
              frames_[t].back().close();
              frames_[t].back().close();  // idempotent
              frames_[t].pop_back();
              active = rp::caching_active();
            }),
         outcome::ok, "close");
  if (m_.close_frame(t, t, m_.frames[t].size() - 1) != outcome::ok) fail("model: closing the innermost frame failed");
  const bool want = !m_.frames[t].empty() && m_.frames[t].back().lease >= 0;
  if (active != want) fail(fmt::format("caching_active() {} after close, the model expected {}", active, want));
}

// Closing a scope or guard that is not the closing thread's innermost: scope_error, nothing changes.
void session::op_close_misuse(int t) {
  int owner = in_.byte() & 1;
  if (frames_[owner].empty()) owner = 1 - owner;
  if (frames_[owner].empty()) return;
  std::size_t index = in_.below(frames_[owner].size());
  if (owner == t && index + 1 == frames_[owner].size()) {
    if (index == 0) {
      if (frames_[1 - t].empty()) return;
      owner = 1 - t;
      index = frames_[owner].size() - 1;
    } else {
      index -= 1;
    }
  }
  trace("thread {}: close frame {} of thread {} (misuse)", t, index, owner);
  const result r = on(t, [&] { frames_[owner][index].close(); });
  const outcome want = m_.close_frame(t, owner, index);
  expect(r, want, "closing a scope out of order or on another thread");
  const char* says = owner == t ? "still open" : "on the thread that opened them";
  if (r.message.find("out of order") == std::string::npos || r.message.find(says) == std::string::npos)
    fail(fmt::format("scope_error message does not say why (\"{}\"): {}", says, r.message));
}

void session::op_reclaim(int t) {
  const int c = in_.byte() & 1;
  const std::size_t keep = keeps[in_.below(std::size(keeps))];
  trace("thread {}: cache {}.reclaim({})", t, c, keep);
  std::size_t freed = 0;
  expect(on(t, [&] { freed = cache_[c]->reclaim(keep); }), outcome::ok, "reclaim");
  const std::size_t want = m_.reclaim(cur_[c], keep);
  if (freed != want) fail(fmt::format("reclaim({}) freed {} B, the model expected {} B", keep, freed, want));
}

void session::op_set_limit(int t) {
  const int c = in_.byte() & 1;
  const std::size_t limit = limits[in_.below(std::size(limits))];
  trace("thread {}: cache {}.set_max_idle_bytes({})", t, c, limit);
  std::size_t now = 0;
  expect(on(t,
            [&] {
              cache_[c]->set_max_idle_bytes(limit);
              now = cache_[c]->max_idle_bytes();
            }),
         outcome::ok, "set_max_idle_bytes");
  m_.set_max_idle(cur_[c], limit);
  if (now != limit) fail(fmt::format("max_idle_bytes() is {} after setting {}", now, limit));
}

void session::op_arm(int) {
  const int b = in_.byte() & 1;
  model_backend& m = m_.be[b];
  if (in_.below(4) == 0) {
    trace("backend {}: disarm", b);
    failing_[b]->disarm();
    m.count = 0;
    return;
  }
  m.first = 1 + in_.below(16);
  m.count = 1 + in_.below(3);
  m.inject_backend_error = in_.below(2) == 0;
  m.calls = 0;
  trace("backend {}: fail calls {}..{} with {}", b, m.first, m.first + m.count - 1,
        m.inject_backend_error ? "backend_error" : "out of memory");
  failing_[b]->arm(m.first, m.count,
                   m.inject_backend_error ? rp::failing_resource::failure::backend_error
                                          : rp::failing_resource::failure::out_of_memory);
}

// Destroys a cache (scopes on it may still be open, buffers from it still live) and makes another.
void session::op_recreate(int t) {
  const int c = in_.byte() & 1;
  if (in_.below(4) != 0) return op_verify(t);
  model_rounding rounding;
  const rp::cache_options options = decode_options(t, rounding);
  trace("thread {}: destroy cache {}, make one with rounding {} and max_idle_bytes {}", t, c,
        options.rounding.to_string(), options.max_idle_bytes);
  expect(on(t,
            [&] {
              cache_[c].reset();
              cache_[c] = std::make_unique<rp::alloc_cache>(options);
            }),
         outcome::ok, "destroy and make a cache");
  m_.close_cache(cur_[c]);
  cur_[c] = m_.new_cache(rounding, options.max_idle_bytes);
  if (cache_[c]->rounding() != options.rounding || cache_[c]->max_idle_bytes() != options.max_idle_bytes)
    fail("a new cache does not report the options it was made with");
  if (open_steps_[c]) {  // a step still open on the destroyed cache: ended later, by op_step or cleanup
    old_steps_.emplace_back(std::move(open_steps_[c]), step_cache_[c]);
    step_cache_[c] = -1;
  }
}

void session::op_verify(int) { verify_all("periodic check"); }

// Runs the next few operations again and again, as a training loop repeats its body: later
// rounds meet the blocks earlier rounds released.
void session::op_repeat(int) {
  if (repeating_) return;
  const std::size_t body = 2 + in_.below(7);
  const std::size_t rounds = 2 + in_.below(3);
  trace("repeat the next {} operations {} times", body, rounds);
  const reader start = in_;
  repeating_ = true;
  for (std::size_t round = 0; round < rounds; ++round) {
    in_ = start;
    for (std::size_t k = 0; k < body && !in_.empty() && steps_ < max_operations; ++k) step();
  }
  repeating_ = false;
}

void session::step() {
  static constexpr op table[] = {
      &session::op_alloc,
      &session::op_alloc,
      &session::op_alloc,
      &session::op_alloc,
      &session::op_alloc,
      &session::op_alloc,
      &session::op_alloc_raw,
      &session::op_alloc_misuse,
      &session::op_drop,
      &session::op_drop,
      &session::op_drop,
      &session::op_copy,
      &session::op_copy,
      &session::op_move,
      &session::op_ref_out,
      &session::op_reshape,
      &session::op_reinterpret,
      &session::op_view,
      &session::op_unsafe_free,
      &session::op_unsafe_free,
      &session::op_access,
      &session::op_write,
      &session::op_record_stream,
      &session::op_scope,
      &session::op_scope,
      &session::op_guard,
      &session::op_close,
      &session::op_close,
      &session::op_close_misuse,
      &session::op_reclaim,
      &session::op_set_limit,
      &session::op_arm,
      &session::op_recreate,
      &session::op_verify,
      &session::op_repeat,
      &session::op_repeat,
      &session::op_in_flight,
      &session::op_step,
      &session::op_cache_alloc,
      &session::op_cache_alloc,
      &session::op_planned_loop,
      &session::op_planned_loop,
      &session::op_plan_sweep,
      &session::op_to_pointer,
      &session::op_free_pointer,
      &session::op_racing_frees,
      &session::op_failing_configure,
  };
  const std::uint8_t code = in_.byte();
  const int t = code >> 6 == 3 ? 1 : 0;  // a quarter of the operations run on the helper
  const std::size_t which = (code & 0x3f) % std::size(table);
  run_op(table[which], t, which);
}

void session::run_op(op f, int t, std::size_t code) {
  const std::size_t n = steps_++;
  op_index = n;
  op_code = code;
  (this->*f)(t);
  all.operations += 1;
  check_all();
  shadow_->step(code, t, n);
  if (n % 16 == 15) verify_all("periodic check");
  if (n % 64 == 63) log_.compact();
}

// One operation of a planned loop's body: requests, releases and faults, mostly on the loop's
// thread, so that the loop's runs repeat their sequences (and plans replay).
void session::loop_step(int t, bool perturbed) {
  static constexpr op table[] = {
      &session::op_alloc,        &session::op_alloc,       &session::op_alloc,         &session::op_alloc,
      &session::op_alloc,        &session::op_alloc,       &session::op_alloc_raw,     &session::op_alloc_raw,
      &session::op_drop,         &session::op_drop,        &session::op_drop,          &session::op_drop,
      &session::op_unsafe_free,  &session::op_copy,        &session::op_move,          &session::op_write,
      &session::op_cache_alloc,  &session::op_cache_alloc, &session::op_record_stream, &session::op_arm,
      &session::op_alloc_misuse, &session::op_access,
  };
  const std::uint8_t code = in_.byte();
  const int thread = code >> 5 == 7 ? 1 - t : t;  // an eighth on the other thread
  const std::size_t which = (code & 0x1f) % std::size(table);
  op f = table[which];
  // A loop of steps: its requests are cache-level (a step serves alloc_cache::allocate).
  if (loop_cache_ >= 0 && (f == &session::op_alloc || f == &session::op_alloc_raw)) f = &session::op_cache_alloc;
  run_op(f, thread, 100 + which);
  if (!perturbed) return;
  const std::uint64_t r = splitmix(++perturb_);
  if (r % 4 == 0) keep_one(t);
  if (r % 4 == 1 && !kept_.empty()) release_kept(t, kept_.size() - 1);
}

// Takes one more reference to a live buffer (a handle's), kept until release_kept.
void session::keep_one(int t) {
  const int hi = static_cast<int>(splitmix(++perturb_) % handle_count);
  const model_handle& m = mh_[hi];
  if (m.gid == 0 || m.freed) return;
  trace("keep a reference to handle {} (block {})", hi, m.gid);
  rp::data_ref ref;
  expect(on(t, [&] { ref = ref_of(h_[hi]); }), outcome::ok, "keep a reference");
  m_.add_ref(m.gid);
  kept_.emplace_back(std::move(ref), m.gid);
}

// Drops kept references until `keep` are left (oldest first).
void session::release_kept(int t, std::size_t keep) {
  while (kept_.size() > keep) {
    const std::uint64_t gid = kept_.front().second;
    trace("drop a kept reference (block {})", gid);
    if (m_.blocks.at(gid).refs == 1) verify_block(gid, "before its last (kept) reference went");
    expect(on(t, [&] { kept_.erase(kept_.begin()); }), outcome::ok, "drop a kept reference");
    m_.drop_ref(gid, false);
    check_all();
  }
}

// More sequences under one key than it keeps plans for (16): short planned runs of 17 to 24
// distinct sizes, then a second pass in an order from the input, so plans are dropped and which
// ones survive (least recently used first) decides what replays.
void session::op_plan_sweep(int t) {
  if (frames_[t].size() >= max_depth) return;
  const int c = in_.byte() & 1;
  const std::size_t n = 17 + in_.below(8);
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < n; ++i) order.push_back(i);
  for (std::size_t i = 0; i < n; ++i) order.push_back(in_.below(n));
  trace("thread {}: plan sweep on cache {}: {} sizes under key 'sweep'", t, c, n);
  for (std::size_t i : order) {
    const std::size_t bytes = 64 * (1 + i);
    const std::uint64_t stamp = next_stamp();
    void* got = nullptr;
    bool intact = true;
    const result r = on(t, [&] {
      rp::scope s(*cache_[c], rp::scope_options{0, "sweep"});
      rp::data_ref ref = rp::allocate(be_[0], bytes);
      got = ref.data();
      fill(got, 0, bytes, stamp);
      for (std::size_t k = 0; k < bytes; ++k)
        intact = intact && static_cast<std::uint8_t*>(got)[k] == pattern(stamp, k);
    });
    m_.enter_scope(t, cur_[c], 0, "sweep");
    std::uint64_t gid = 0;
    std::size_t oom = 0;
    const outcome want = m_.allocate(t, 0, bytes, nullptr, gid, oom);
    expect(r, want, "a sweep's request");
    if (want == outcome::ok) {
      accept_block(gid, got, stamp, "a sweep's request");
      if (!intact) fail("a sweep's buffer lost its pattern while its run held it");
      m_.drop_ref(gid, false);
    }
    if (m_.close_frame(t, t, m_.frames[t].size() - 1) != outcome::ok) fail("model: closing a sweep's scope failed");
    check_all();
  }
}

// A training loop: a few rounds of one body, each inside a planned scope (or a planned step)
// under one key. The rounds repeat the body's requests, so the key records, then replays; the
// body's releases, escapes, unsafe frees, faults and requests on the other thread perturb it.
void session::op_planned_loop(int t) {
  if (repeating_) return;
  const int c = in_.byte() & 1;
  const bool as_step = in_.below(4) == 0;
  const std::size_t k = in_.below(10);
  const std::string key = fmt::format("key{}", k < 5 ? 0 : k < 8 ? 1 : 2);  // key0 often: many plans per key
  const std::size_t body = 4 + in_.below(13);
  const std::size_t rounds = 2 + in_.below(4);
  // Sometimes the other thread runs a planned scope of its own at the same time (its runs then
  // meet this loop's on a shared arena).
  const int other = 1 - t;
  const std::string rival = in_.below(3) == 0 ? fmt::format("key{}", in_.below(3)) : std::string();
  trace("thread {}: planned loop on cache {} ({}, key {}): {} rounds of {} operations{}{}", t, c,
        as_step ? "steps" : "scopes", key, rounds, body, rival.empty() ? "" : "; rival key ", rival);
  const bool perturbing = in_.below(2) == 0;
  const std::size_t place = in_.below(16);  // mostly backend 0, no stream
  loop_backend_ = place == 15 ? 1 : 0;
  loop_stream_ =
      place >= 12 && place < 15 ? reinterpret_cast<void*>(static_cast<std::uintptr_t>(place - 11) << 12) : nullptr;
  loop_cache_ = as_step ? c : -1;
  const reader start = in_;
  perturb_ = splitmix(seed_ ^ (static_cast<std::uint64_t>(body) << 8 | rounds) ^ steps_);
  repeating_ = true;
  for (std::size_t round = 0; round < rounds && steps_ < max_operations; ++round) {
    in_ = start;
    const std::size_t depth = frames_[t].size();
    bool opened = false;
    if (as_step) {
      if (!open_steps_[c]) {
        std::unique_ptr<rp::step> made;
        expect(on(t,
                  [&] {
                    made = std::make_unique<rp::step>(*cache_[c], rp::scope_options{0, key});
                  }),
               m_.open_step(cur_[c], 0, key), "a loop's step");
        open_steps_[c] = std::move(made);
        step_cache_[c] = cur_[c];
        opened = true;
      }
    } else if (depth < max_depth) {
      expect(on(t,
                [&] {
                  real_frame f;
                  f.scope = std::make_unique<rp::scope>(*cache_[c], rp::scope_options{0, key});
                  frames_[t].push_back(std::move(f));
                }),
             outcome::ok, "a loop's scope");
      m_.enter_scope(t, cur_[c], 0, key);
      opened = true;
    }
    const std::size_t other_depth = frames_[other].size();
    if (!rival.empty() && other_depth < max_depth) {
      expect(on(other,
                [&] {
                  real_frame f;
                  f.scope = std::make_unique<rp::scope>(*cache_[c], rp::scope_options{0, rival});
                  frames_[other].push_back(std::move(f));
                }),
             outcome::ok, "a rival's scope");
      m_.enter_scope(other, cur_[c], 0, rival);
    }
    for (std::size_t k = 0; k < body && !in_.empty() && steps_ < max_operations; ++k)
      loop_step(t, perturbing && round > 0);
    while (frames_[other].size() > other_depth) op_close(other);
    if (!opened) continue;
    if (as_step) {
      if (open_steps_[c] && step_cache_[c] == cur_[c]) {
        expect(on(t, [&] { open_steps_[c].reset(); }), outcome::ok, "the end of a loop's step");
        m_.end_step(step_cache_[c]);
        step_cache_[c] = -1;
      }
    } else {
      while (frames_[t].size() > depth) op_close(t);
    }
    check_all();
    release_kept(t, kept_.size() / 2);  // the others live on into the next round: escapes
  }
  release_kept(t, 0);
  loop_backend_ = -1;
  loop_cache_ = -1;
  repeating_ = false;
}

// ---- the input ----------------------------------------------------------------------------

void session::cleanup() {
  in_cleanup = true;
  for (int t = 0; t < threads; ++t)
    while (!frames_[t].empty()) op_close(t);
  for (int c = 0; c < 2; ++c) {
    if (!open_steps_[c]) continue;
    open_steps_[c]->end();
    open_steps_[c].reset();
    m_.end_step(step_cache_[c]);
  }
  for (auto& [st, model_cache] : old_steps_) {
    st->end();
    m_.end_step(model_cache);
  }
  old_steps_.clear();
  while (!pointers_.empty()) free_kept(0, pointers_.size() - 1);
  for (int i = 0; i < handle_count; ++i) {
    pre_drop_verify(i);
    h_[i] = std::monostate{};
    drop_model(i);
  }
  check_all();
  for (int c = 0; c < 2; ++c) {
    cache_[c].reset();
    m_.close_cache(cur_[c]);
  }
  m_.expect_no_more_events("destroying the caches");
  shadow_->finish();
  if (!m_.blocks.empty()) fail(fmt::format("model: {} blocks left at the end", m_.blocks.size()));
  for (int b = 0; b < backends; ++b)
    if (be_[b].outstanding_bytes() != 0 || limited_[b]->used() != 0)
      fail(fmt::format("leak: backend {} has {} B outstanding at the end", b, be_[b].outstanding_bytes()));
  for (const model_cache& c : m_.caches) {
    for (const model_slot& s : c.slots) {
      all.hits += s.hits;
      all.misses += s.misses;
      all.steals += s.steals;
      all.escapes += s.escapes;
      all.unsafe_frees += s.unsafe_frees;
    }
    all.evictions += c.evictions;
    all.reclaimed += c.reclaimed;
    all.oom_retries += c.oom_retries;
  }
  const model_plan_totals& pt = m_.plan_totals;
  all.plan_runs += pt.runs;
  all.region_hits += pt.region_hits;
  all.conflicts += pt.conflicts;
  all.divergences += pt.divergences;
  all.recordings += pt.recordings;
  all.run_escapes += pt.escapes;
  all.busy_runs += pt.busy;
  all.pauses += pt.pauses;
  all.arenas += pt.arenas;
  all.arena_frees += pt.arena_frees;
  all.stale += pt.stale;
  all.plan_evictions += pt.evictions;
  for (const model_cache& c : m_.caches) all.steps += c.steps;
  for (int b = 0; b < backends; ++b) {
    all.injected_faults += m_.be[b].injected;
    all.limit_failures += m_.be[b].limit_failures;
    if (failing_[b]->injected() != m_.be[b].injected)
      fail(fmt::format("backend {}: {} faults injected, the model counted {}", b, failing_[b]->injected(),
                       m_.be[b].injected));
  }
}

void session::run() {
  seed_ = in_.byte();
  shadow_ = std::make_unique<segment_shadow>(seed_, [](int t, const std::function<void()>& job) {
    if (t == 0)
      job();
    else
      helper().run(job);
  });
  make_backends();
  for (int c = 0; c < 2; ++c) {
    model_rounding rounding;
    const rp::cache_options options = decode_options(0, rounding);
    cache_[c] = std::make_unique<rp::alloc_cache>(options);
    cur_[c] = m_.new_cache(rounding, options.max_idle_bytes);
  }
  // Most inputs start inside a scope on each thread, as code using a cache does.
  for (int t = 0; t < threads; ++t)
    if (in_.below(4) != 0) op_scope(t);
  trace("input: backend 1 holds {} B; caches: {} / {}", m_.be[1].capacity, cache_[0]->rounding().to_string(),
        cache_[1]->rounding().to_string());
  while (steps_ < max_operations && !in_.empty()) step();
  cleanup();
  all.inputs += 1;
}

void fail(const std::string& what) {
  const std::string where = in_cleanup ? "cleanup" : fmt::format("operation {} (code {})", op_index, op_code);
  fmt::print(stderr, "\nrefpool fuzz: MISMATCH in {} on thread {}:\n  {}\n", where, op_thread, what);
  if (const char* keep = std::getenv("REFPOOL_FUZZ_KEEP")) {  // the input, to replay or add to the corpus
    if (std::FILE* f = std::fopen(keep, "wb")) {
      std::fwrite(current_input.data(), 1, current_input.size(), f);
      std::fclose(f);
      fmt::print(stderr, "  (input of {} bytes written to {})\n", current_input.size(), keep);
    }
  }
  if (!tracing) fmt::print(stderr, "  (rerun with REFPOOL_FUZZ_TRACE=1 to print every operation)\n");
  std::fflush(stderr);
  std::abort();
}

void run_input(const std::uint8_t* data, std::size_t size) {
  current_input.assign(data, data + size);
  in_cleanup = false;
  op_index = 0;
  if (tracing) fmt::print(stderr, "input of {} bytes\n", size);
  session s(data, size);
  s.run();
}

const totals& get_totals() noexcept { return all; }

void print_totals() {
  fmt::print(stderr,
             "refpool fuzz: {} operations in {} inputs; hits {}, misses {}, steals {}, escapes {}, unsafe frees {}, "
             "evictions {}, reclaimed {}, oom retries {}; faults injected {}, limit refusals {}; expected errors "
             "checked {}\n",
             all.operations, all.inputs, all.hits, all.misses, all.steals, all.escapes, all.unsafe_frees, all.evictions,
             all.reclaimed, all.oom_retries, all.injected_faults, all.limit_failures, all.expected_errors);
  fmt::print(stderr,
             "refpool fuzz: planned: {} runs, {} region hits, {} conflicts, {} divergences, {} recordings, {} escapes, "
             "{} stale plans, {} busy runs, {} pauses, {} plans dropped, {} arenas made ({} freed); {} steps, {} "
             "cache-level requests\n",
             all.plan_runs, all.region_hits, all.conflicts, all.divergences, all.recordings, all.run_escapes, all.stale,
             all.busy_runs, all.pauses, all.plan_evictions, all.arenas, all.arena_frees, all.steps, all.cache_level);
  fmt::print(stderr,
             "refpool fuzz: requests held in the backend while their cache was destroyed {}, their step ended {}, "
             "their cache reclaimed {}, a buffer released {} ({} through scopes); late frees of an address handed "
             "out again {}; double frees racing pointer_ref {} ({} handles taken meanwhile); rejected configure "
             "calls {}\n",
             all.held_destroyed, all.held_step_ended, all.held_reclaimed, all.held_released, all.held_in_scopes,
             all.stale_frees_rehanded, all.racing_frees, all.racing_pins, all.configure_failures);
  print_segment_totals();
  std::fflush(stderr);
}

}  // namespace refpool::test::fuzz
