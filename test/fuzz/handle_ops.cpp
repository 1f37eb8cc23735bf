// What owners do with their handles: drop, copy, move, take the data_ref out, reshape,
// reinterpret, view, unsafe_free, access after unsafe_free, write, and record a stream.
#include <fmt/ranges.h>

#include "session.hpp"

namespace refpool::test::fuzz {

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

}  // namespace refpool::test::fuzz
