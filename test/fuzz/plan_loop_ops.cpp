// Planned scopes and steps as training loops use them: rounds of one body under a key (recorded,
// then replayed, perturbed by kept references and the other thread), and sweeps over more
// sequences than a key keeps plans for.
#include "session.hpp"

namespace refpool::test::fuzz {

// One operation of a planned loop's body: requests, releases and faults, mostly on the loop's
// thread, so that the loop's runs repeat their sequences (and plans replay); kept references
// (escapes, late releases) go on either thread.
void session::loop_step(int t, bool perturbed, bool holding) {
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
  if (r % 4 == 0 || holding) keep_one(t);
  // The oldest kept reference goes, on either thread, while this run replays: often an escaped
  // region of an earlier round whose plan was dropped since (replaced as stale, or evicted), and
  // then its plan's last reference, in the arena this run holds (issue 35).
  if (r % 4 == 1 && !kept_.empty()) {
    const int by = (r >> 8) % 2 == 0 ? t : 1 - t;
    const model_block& b = m_.blocks.at(kept_.front().second);
    if (by != t && b.refs == 1 && b.kind == block_kind::region) {
      const model_plan& p = m_.plans[static_cast<std::size_t>(b.plan)];
      all.dropped_escapes_released_elsewhere += p.regions[b.region].pinned && !p.in_store ? 1 : 0;
    }
    release_kept(by, kept_.size() - 1);
  }
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
    trace("thread {}: drop a kept reference (block {})", t, gid);
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
  const std::uint8_t code = in_.byte();
  const int c = code & 1;
  if ((code >> 1) % 16 == 15) return plan_stream(t, c, (code >> 5) % 2 == 0, code >> 6 == 3);  // one sweep in 16
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

// A serving loop under one key: 40 to 100 runs of sequences never seen before (the key passes
// after 32: its runs then have no router), then, half the time, a few sequences in turn until the
// probes see them repeat, the key learns again and replays. As planned steps or scopes.
// Half the streams begin with two nested scopes of the key open on the other thread, recording
// one sequence, and end them after the pass entry: they must add no plan (nor an arena) to a
// key in pass. A quarter of the long ones ask for one size each that no backend holds for 64 runs
// after the new sequences (the probe window among them): failed probes are no repeats. A quarter
// end with shapes in random order under a key of their own (plan_shapes).
void session::plan_stream(int t, int c, bool as_step, bool then_shapes) {
  if (as_step && open_steps_[c]) return;
  // Pass at run 32 at the latest, for 64 runs, then 32 probes: by run 128 the repeating sequences
  // have been probed, and two rounds of them later they replay.
  const std::size_t fresh = 40 + in_.below(61);
  // A quarter of the cycles are longer than the 16 plans a key keeps at first (17 to 28: the probe
  // window of 32 runs sees them come again): the key keeps more plans and replays them.
  const std::size_t cycle = in_.below(4) == 0 ? 17 + in_.below(12) : 1 + in_.below(4);
  const std::size_t total = in_.below(2) == 0 ? fresh : 140 + in_.below(40);
  const int other = 1 - t;
  const bool late = fresh % 2 == 0 && frames_[other].size() + 2 <= max_depth;
  const bool failing = total > fresh && (fresh / 2) % 2 == 0;
  // A quarter of the long ones run twice: the first time's new sequences paused the key (they
  // re-record) before it passed, and it learned again; the second time's pause must be as short
  // as the first's, so that it is over when the key learns again (no pause outlives a pass).
  const std::size_t rounds = total > fresh && !failing && cycle % 2 == 0 ? 2 : 1;
  trace("thread {}: plan stream on cache {} ({}): {} new sequences, then {} in turn to run {}{}{}, {} time(s)", t, c,
        as_step ? "steps" : "scopes", fresh, cycle, total, late ? ", two scopes open on the other thread" : "",
        failing ? ", failing requests" : "", rounds);
  std::vector<std::pair<rp::data_ref, std::uint64_t>> late_live;
  if (late)
    for (int depth = 0; depth < 2; ++depth) open_late_scope(other, c, late_live);
  if (rounds == 1 && total > fresh && !failing && cycle == 3) pause_long(t, c, as_step);
  for (std::size_t i = 0; i < rounds * total && steps_ < max_operations; ++i) {
    const std::size_t run = i % total, round = i / total;
    std::vector<std::size_t> sizes;
    if (run < fresh) {
      for (std::size_t j = 0; j <= run % 3; ++j) sizes.push_back(64 * (1 + (run * 3 + j + round * 100) % 509));
    } else if (failing && run < fresh + 64) {
      sizes.push_back(backend0_capacity + 64 * (1 + run));  // out of memory after reclaim
    } else {
      for (std::size_t j = 0; j < 2; ++j) sizes.push_back(64 * (520 + (run % cycle) * 2 + j));
    }
    stream_run(t, c, as_step, sizes);
    if (run % 16 == 15) check_all();
    if (late && i == 35) close_late_scopes(other, late_live);
  }
  if (late && !late_live.empty()) close_late_scopes(other, late_live);
  if (then_shapes) plan_shapes(t, c, as_step, cycle % 2 == 0);
}

// 24 shapes in random order under key "shapes": near repeats many, the others further back, so
// the key grows to keep them all while its re-recordings pause it. With `prefixes` each shape is
// a prefix of the next (runs end short of the plan they replay, or switch at its end), else they
// share first requests (runs switch plans or diverge). Paused, such runs are hashed as their
// plan's requests so far: what grows the key (and keeps it from passing).
void session::plan_shapes(int t, int c, bool as_step, bool prefixes) {
  trace("thread {}: 24 shapes ({}) in random order on cache {}", t, prefixes ? "prefixes" : "shared first requests", c);
  for (std::size_t run = 0; run < 24 * 8 && steps_ < max_operations; ++run) {
    const std::size_t shape = splitmix(seed_ ^ (0x5A7E5 + run)) % 24;
    std::vector<std::size_t> sizes;
    if (prefixes) {
      for (std::size_t j = 0; j < shape + 3; ++j) sizes.push_back(256 * (1 + j % 3));
    } else {
      for (std::size_t j = 0, d = shape; j < 6; ++j, d /= 3) sizes.push_back(256 * (4 + d % 3));
    }
    stream_run(t, c, as_step, sizes, "shapes");
    if (run % 16 == 15) check_all();
  }
}

// A quarter of the other long streams begin with a loop that replays one sequence in every three
// runs and records new ones between (it keeps re-recording, so its pauses grow to 256 runs), until
// the key is paused for 220 more runs: the key passes, probes and learns again while that pause
// still holds, and learning must lift it.
void session::pause_long(int t, int c, bool as_step) {
  const auto paused_for = [&]() -> std::uint64_t {
    for (const model_key& k : m_.caches[static_cast<std::size_t>(cur_[c])].plans.keys)
      if (k.name == "stream") return k.passing || k.paused_until <= k.runs ? 0 : k.paused_until - k.runs;
    return 0;
  };
  for (std::size_t run = 0; run < 420 && paused_for() < 220 && steps_ < max_operations; ++run) {
    std::vector<std::size_t> sizes = {64 * 700, 64 * 703};
    if (run % 3 != 0) sizes = {64 * (720 + run), 64 * (720 + run)};
    stream_run(t, c, as_step, sizes);
    if (run % 16 == 15) check_all();
  }
}

// A planned scope of the stream's key on thread `u`, with one request of the same size each time.
void session::open_late_scope(int u, int c, std::vector<std::pair<rp::data_ref, std::uint64_t>>& live) {
  open_key_scope(u, c, "stream", "a late scope");
  const std::size_t bytes = 64 * 600;
  rp::data_ref ref;
  const result r = on(u, [&] { ref = rp::allocate(be_[0], bytes); });
  std::uint64_t gid = 0;
  std::size_t oom = 0;
  const outcome want = m_.allocate(u, 0, bytes, nullptr, gid, oom);
  expect(r, want, "a late scope's request");
  if (want != outcome::ok) return;
  const std::uint64_t stamp = next_stamp();
  fill(ref.data(), 0, bytes, stamp);
  accept_block(gid, ref.data(), stamp, "a late scope's request");
  live.emplace_back(std::move(ref), gid);
}

// Ends the two late scopes, inner first: their buffers go at each one's end.
void session::close_late_scopes(int u, std::vector<std::pair<rp::data_ref, std::uint64_t>>& live) {
  for (int depth = 0; depth < 2; ++depth) {
    if (!live.empty()) {
      const std::uint64_t gid = live.back().second;
      verify_block(gid, "before a late scope's buffer went");
      expect(on(u, [&] { live.pop_back(); }), outcome::ok, "a late scope's release");
      m_.drop_ref(gid, false);
    }
    expect(on(u, [&] { frames_[u].pop_back(); }), outcome::ok, "the end of a late scope");
    if (m_.close_frame(u, u, m_.frames[u].size() - 1) != outcome::ok) fail("model: closing a late scope failed");
    check_all();
  }
}

// A planned scope of `key` on thread `t`.
void session::open_key_scope(int t, int c, const std::string& key, const char* what) {
  expect(on(t,
            [&] {
              real_frame f;
              f.scope = std::make_unique<rp::scope>(*cache_[c], rp::scope_options{0, key});
              frames_[t].push_back(std::move(f));
            }),
         outcome::ok, what);
  m_.enter_scope(t, cur_[c], 0, key);
}

// One run of a plan stream: its requests, released at its end (the last one after it, now and then:
// an escape).
void session::stream_run(int t, int c, bool as_step, const std::vector<std::size_t>& sizes, const std::string& key) {
  if (as_step) {
    std::unique_ptr<rp::step> made;
    expect(on(t, [&] { made = std::make_unique<rp::step>(*cache_[c], rp::scope_options{0, key}); }),
           m_.open_step(cur_[c], 0, key), "a stream's step");
    open_steps_[c] = std::move(made);
    step_cache_[c] = cur_[c];
  } else {
    open_key_scope(t, c, key, "a stream's scope");
  }
  std::vector<std::pair<rp::data_ref, std::uint64_t>> live;
  for (std::size_t bytes : sizes) {
    rp::data_ref ref;
    const result r = on(t, [&] { ref = as_step ? cache_[c]->allocate(be_[0], bytes) : rp::allocate(be_[0], bytes); });
    std::uint64_t gid = 0;
    std::size_t oom = 0;
    const outcome want = as_step ? m_.cache_allocate(t, cur_[c], 0, bytes, nullptr, gid, oom)
                                 : m_.allocate(t, 0, bytes, nullptr, gid, oom);
    expect(r, want, "a stream's request");
    if (want != outcome::ok) continue;
    const std::uint64_t stamp = next_stamp();
    fill(ref.data(), 0, bytes, stamp);
    accept_block(gid, ref.data(), stamp, "a stream's request");
    live.emplace_back(std::move(ref), gid);
  }
  const bool escape = !live.empty() && splitmix(++perturb_) % 8 == 0;
  const auto release = [&](std::size_t keep) {
    while (live.size() > keep) {
      const std::uint64_t gid = live.back().second;
      verify_block(gid, "before a stream's buffer went");
      expect(on(t, [&] { live.pop_back(); }), outcome::ok, "a stream's release");
      m_.drop_ref(gid, false);
    }
  };
  release(escape ? 1 : 0);
  if (as_step) {
    expect(on(t, [&] { open_steps_[c].reset(); }), outcome::ok, "the end of a stream's step");
    m_.end_step(step_cache_[c]);
    step_cache_[c] = -1;
  } else {
    expect(on(t, [&] { frames_[t].pop_back(); }), outcome::ok, "the end of a stream's scope");
    if (m_.close_frame(t, t, m_.frames[t].size() - 1) != outcome::ok) fail("model: closing a stream's scope failed");
  }
  release(0);
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
      open_key_scope(t, c, key, "a loop's scope");
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
    // Now and then a replayed round holds its buffers past their recorded releases: its plan goes
    // stale and is replaced (dropped) at its end, while its escapes live on into the next rounds.
    const bool holding = perturbing && round >= 2 && splitmix(++perturb_) % 2 == 0;
    for (std::size_t k = 0; k < body && !in_.empty() && steps_ < max_operations; ++k)
      loop_step(t, perturbing && round > 0, holding);
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
    release_kept(round % 2 == 0 ? t : other, kept_.size() / 2);  // the others live on into the next round: escapes
  }
  release_kept(t, 0);
  loop_backend_ = -1;
  loop_cache_ = -1;
  repeating_ = false;
}

}  // namespace refpool::test::fuzz
