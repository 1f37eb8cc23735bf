// Requests: arrays and raw buffers from a backend (through the thread's innermost scope or
// guard), cache-level requests (alloc_cache::allocate), and requests that must fail.
#include <fmt/ranges.h>

#include "session.hpp"

namespace refpool::test::fuzz {

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

}  // namespace refpool::test::fuzz
