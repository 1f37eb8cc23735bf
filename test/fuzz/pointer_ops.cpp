// Free by pointer (refpool/pointer.hpp), as a framework's allocator hook uses it: copies of
// handles' references handed to the pointer table and freed by address, sometimes twice (a
// double free), sometimes late, after the cache handed the address out again (a stale free), and
// twice at once while the other thread takes handles by the address (racing frees).
#include <refpool/pointer.hpp>

#include <atomic>

#include "session.hpp"

namespace refpool::test::fuzz {

void session::op_to_pointer(int t) { hand_over(t, pick_handle()); }

void session::hand_over(int t, int a) {
  const model_handle source = mh_[a];
  trace("to_pointer(copy of handle {})", a);
  void* got = nullptr;
  const result r = on(t, [&] {
    rp::data_ref copy = ref_of(h_[a]);  // throws use_after_free for an unsafe_freed handle
    got = rp::to_pointer(std::move(copy));
  });
  expect(r, source.freed ? outcome::use_after_free : outcome::ok, "to_pointer");
  if (source.freed) return;
  if (source.gid == 0) {
    if (got != nullptr) fail(fmt::format("to_pointer of an empty handle gave {}", got));
    return;
  }
  if (got != m_.blocks.at(source.gid).ptr)
    fail(fmt::format("to_pointer gave {}, the model's block {} is at {}", got, source.gid,
                     m_.blocks.at(source.gid).ptr));
  if (!kept(source.gid)) m_.add_ref(source.gid);
  pointers_.push_back({got, source.gid});
}

void session::free_kept(int t, std::size_t i) {
  const kept_pointer k = pointers_[i];
  pointers_.erase(pointers_.begin() + static_cast<std::ptrdiff_t>(i));
  const bool last = !kept(k.gid);
  trace("free_pointer({}) of block {}{}", k.ptr, k.gid, last ? ", its last hand-over" : "");
  if (last && m_.blocks.at(k.gid).refs == 1) verify_block(k.gid, "before its last hand-over was freed");
  expect(on(t, [&] { rp::free_pointer(k.ptr); }), outcome::ok, "free_pointer");
  if (last) m_.drop_ref(k.gid, false);
  if (last && freed_pointers_.size() < 16) freed_pointers_.push_back({k.ptr, k.gid, arena_at(k.ptr)});
}

int session::arena_at(const void* ptr) const {
  for (std::size_t a = m_.first_live_arena; a < m_.arenas.size(); ++a) {
    const model_arena& arena = m_.arenas[a];
    if (arena.memory && ptr >= arena.base && ptr < static_cast<const char*>(arena.base) + arena.bytes)
      return static_cast<int>(a);
  }
  return -1;
}

// Only addresses refpool still owns can come back deterministically: a cached block the cache may
// hand out again, or a region of an arena still allocated. Memory back with the backend may come
// back at the same address or not, as malloc pleases.
void session::forget_returned_addresses() {
  std::erase_if(freed_pointers_, [&](const freed_pointer& f) {
    const auto b = m_.blocks.find(f.gid);
    const bool cached = b != m_.blocks.end() && b->second.ptr == f.ptr && b->second.kind == block_kind::cached;
    const bool in_arena = f.arena >= 0 && m_.arenas[static_cast<std::size_t>(f.arena)].memory;
    return !cached && !in_arena;
  });
}

// A late free of an address whose buffer was freed: a double free, or, once the address was
// handed out again (the cache reuses buffers), the new owner's free: refpool cannot tell them
// apart (pointer.hpp), and the model expects exactly that.
void session::stale_free(int t) {
  void* const ptr = freed_pointers_[in_.below(freed_pointers_.size())].ptr;
  // Most often the cache has handed the address out again by now: hand that buffer over too.
  for (int i = 0; i < handle_count; ++i) {
    const model_handle& m = mh_[i];
    if (m.gid != 0 && !m.freed && m_.blocks.at(m.gid).ptr == ptr && m.offset == 0) {
      hand_over(t, i);
      break;
    }
  }
  const auto now =
      std::find_if(pointers_.begin(), pointers_.end(), [&](const kept_pointer& k) { return k.ptr == ptr; });
  if (now != pointers_.end()) {
    trace("free_pointer({}) late: the address was handed out again", ptr);
    all.stale_frees_rehanded += 1;
    free_kept(t, static_cast<std::size_t>(now - pointers_.begin()));
    return;
  }
  trace("free_pointer({}) late: a double free", ptr);
  expect(on(t, [&] { rp::free_pointer(ptr); }), outcome::invalid_argument, "a late free by pointer");
}

void session::op_free_pointer(int t) {
  if (pointers_.empty() || in_.below(8) == 0) {
    forget_returned_addresses();
    if (!freed_pointers_.empty() && in_.below(2) == 0) return stale_free(t);
    // Never handed out: inside a kept buffer (buffers start 256-byte aligned), or on the stack.
    int local = 0;
    void* bogus = pointers_.empty() ? static_cast<void*>(&local) : static_cast<char*>(pointers_.front().ptr) + 1;
    trace("free_pointer({}), never handed out", bogus);
    expect(on(t, [&] { rp::free_pointer(bogus); }), outcome::invalid_argument, "free_pointer of an unknown pointer");
    return;
  }
  const std::size_t i = in_.below(pointers_.size());
  void* const ptr = pointers_[i].ptr;
  free_kept(t, i);
  if (in_.below(4) != 0) return;
  // Again: a double free, unless another hand-over of the buffer is kept.
  const auto other =
      std::find_if(pointers_.begin(), pointers_.end(), [&](const kept_pointer& k) { return k.ptr == ptr; });
  if (other != pointers_.end()) {
    free_kept(t, static_cast<std::size_t>(other - pointers_.begin()));
  } else {
    trace("free_pointer({}) again: a double free", ptr);
    expect(on(t, [&] { rp::free_pointer(ptr); }), outcome::invalid_argument, "a double free by pointer");
  }
}

// Two frees of one hand-over while the helper keeps taking handles by the address (pointer_ref:
// each a pin in the table while it runs): exactly one free is accepted, whatever the pins do
// (issue 23 row 4), and afterwards the address is unknown. A handle keeps the buffer, so no
// release in the race is its last: what the race leaves is the same whichever thread ran first.
// Real threads at once: a few rounds, as a pin must span the moment of a free to matter; the
// helper gives up after max_pins handles (then the frees ran without a pin: no race, same result).
void session::op_racing_frees(int) {
  constexpr std::uint64_t max_pins = 4096;
  const int a = pick_handle();
  const std::size_t rounds = 1 + in_.below(4);
  const model_handle& m = mh_[a];
  if (m.gid == 0 || m.freed || kept(m.gid)) return;  // a buffer no hand-over keeps yet
  op_thread = 0;
  for (std::size_t round = 0; round < rounds; ++round) {
    hand_over(0, a);
    void* const ptr = pointers_.back().ptr;
    pointers_.pop_back();
    trace("free_pointer({}) twice while thread 1 takes handles by the address", ptr);
    std::atomic<bool> looking{false}, stop{false}, wrong_buffer{false};
    std::atomic<std::uint64_t> taken{0};
    const std::function<void()> look = [&] {
      for (std::uint64_t n = 0; !stop.load(std::memory_order_relaxed) && n < max_pins; ++n) {
        try {
          const rp::data_ref r = rp::pointer_ref(ptr);
          if (r.data() != ptr) wrong_buffer = true;
          taken.fetch_add(1, std::memory_order_relaxed);
        } catch (const rp::invalid_argument&) {
          if (looking.load()) return;  // freed: nothing left to take
        }
        looking.store(true);
      }
    };
    helper().start(look);
    while (!looking.load()) std::this_thread::yield();
    const result first = attempt([&] { rp::free_pointer(ptr); });
    const result second = attempt([&] { rp::free_pointer(ptr); });
    stop = true;
    helper().finish();
    op_thread = 0;
    expect(first, outcome::ok, "the first of two racing frees by pointer");
    expect(second, outcome::invalid_argument, "the second of two racing frees by pointer (a double free)");
    if (wrong_buffer) fail(fmt::format("pointer_ref({}) gave a handle to another buffer", ptr));
    m_.drop_ref(m.gid, false);  // the table's reference: a handle keeps the buffer
    expect(attempt([&] { rp::free_pointer(ptr); }), outcome::invalid_argument, "a free after two racing frees");
    expect(attempt([&] { (void)rp::pointer_ref(ptr); }), outcome::invalid_argument, "pointer_ref after racing frees");
    all.racing_frees += 1;
    all.racing_pins += taken.load();
    check_all();
  }
}

}  // namespace refpool::test::fuzz
