// At an input's end, before its caches go, one of three ends the operations cannot make (chosen by
// the input's state, reading no byte, so the corpus decodes as before; one input in four, four and
// thirty-two):
//  - the idle limit racing close(): a release on the helper thread puts a block of thread 0's
//    cache-level slot back over the cache's idle limit (0) and frees what is idle itself; its first
//    free is held in the backend (the call gate) while thread 0 destroys the cache. The model
//    applies the release with its frees first, then the destruction: the order their effects landed.
//  - a thread's teardown: a new thread makes a request through a cache of its own (so refpool's
//    state of the thread exists, given back by refpool's pthread key destructor), then sets a
//    pthread key made after refpool's (its destructor runs after refpool's), and ends. That
//    destructor makes cache-level requests on both caches (served without a cache: the model
//    expects the backend's allocation of exactly the request), drops a handle and frees a
//    hand-over by pointer.
//  - the process's teardown, in a forked child: thread 0 calls exit(), which destroys its
//    thread_locals first (glibc), and then a handler registered with atexit does the same, plus a
//    request through thread 0's innermost scope and the checks of both caches' stats and every
//    handle. The child ends with _exit (the helper thread is not in it); a mismatch aborts it.
#include <cerrno>
#include <cstring>

#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <refpool/pointer.hpp>

#include "session.hpp"

namespace refpool::test::fuzz {

namespace {

/// The job a thread runs at its end, from a pthread key's destructor that runs after refpool's:
/// refpool makes its key at the process's first cache-level request, and the key here is made
/// after one (keys' destructors run in the order the keys were made).
pthread_key_t late_key;
void run_late_job(void* job) { (*static_cast<std::function<void()>*>(job))(); }
void make_late_key() {
  if (pthread_key_create(&late_key, run_late_job) != 0) fail("pthread_key_create failed");
}

}  // namespace

void session::teardown_scenario() {
  // A fork copies the process's page tables (about 6 ms here): the process's end is the rarest.
  const std::uint64_t pick = (seed_ ^ steps_) % 32;
  if (pick < 8) return release_while_destroyed();
  if (pick < 16) return requests_after_thread_end();
  if (pick == 16) return requests_after_process_end();
}

// The cache is made anew (nothing else holds its state: no lease, scope, step or block of an
// earlier operation), with an idle limit of 0; thread 0 allocates in a scope on it and closes the
// scope, so the block's slot has no owner and the helper's release puts it back itself.
void session::release_while_destroyed() {
  const int c = static_cast<int>(seed_ & 1);
  const int hi = static_cast<int>(seed_ % handle_count);
  const int b = static_cast<int>(steps_ & 1);
  const std::size_t bytes = raw_sizes[steps_ % std::size(raw_sizes)];
  trace("thread 0: cache {} made anew with max_idle_bytes 0, allocate({} B, backend {}) in a scope on it -> handle "
        "{}; thread 1 drops it, its eviction held in the backend while thread 0 destroys the cache",
        c, bytes, b, hi);
  const auto make_cache_anew = [&](std::size_t max_idle) {
    rp::cache_options options;
    options.max_idle_bytes = max_idle;
    expect(on(0, [&] { cache_[c] = std::make_unique<rp::alloc_cache>(options); }), outcome::ok,
           "destroy a cache and make one");
    m_.close_cache(cur_[c]);
    cur_[c] = m_.new_cache(model_rounding{}, max_idle, true);
    if (open_steps_[c]) {  // ended by cleanup
      old_steps_.emplace_back(std::move(open_steps_[c]), step_cache_[c]);
      step_cache_[c] = -1;
    }
  };
  make_cache_anew(0);
  const int ci = cur_[c];
  pre_drop_verify(hi);
  const std::uint64_t stamp = next_stamp();
  void* got = nullptr;
  const result r = on(0, [&] {
    rp::scope s(*cache_[c]);
    rp::data_ref ref = rp::allocate(be_[b], bytes);
    got = ref.data();
    fill(got, 0, bytes, stamp);
    h_[hi] = std::move(ref);
  });
  m_.enter_scope(0, ci, 0);
  std::uint64_t gid = 0;
  std::size_t oom = 0;
  const outcome want = m_.allocate(0, b, bytes, nullptr, gid, oom);
  if (want == outcome::ok) {  // the handle's old buffer went before the scope closed
    drop_model(hi);
    mh_[hi] = model_handle{};
    mh_[hi].kind = ref_kind;
    mh_[hi].gid = gid;
  }
  if (m_.close_frame(0, 0, m_.frames[0].size() - 1) != outcome::ok) fail("model: the scenario's scope did not close");
  expect(r, want, "allocate() in a scope on a new cache, before a release that races its destruction");
  if (want == outcome::out_of_memory) check_oom(r, oom);
  if (want != outcome::ok) return;
  accept_block(gid, got, stamp, "allocate()");
  check_all();

  pre_drop_verify(hi);
  const std::size_t before = log_.logged();
  const std::function<void()> job = [&] { h_[hi] = std::monostate{}; };
  gate_.arm(true);
  op_thread = 1;
  helper().start(job);
  while (!gate_.parked() && !helper().finished()) std::this_thread::yield();
  const bool held = gate_.disarm();
  std::size_t during = before;
  if (held) {
    expect(on(0, [&] { cache_[c] = std::make_unique<rp::alloc_cache>(rp::cache_options{}); }), outcome::ok,
           "destroy a cache while a release frees its idle blocks");
    during = log_.logged();
  }
  gate_.let_go();
  helper().finish();
  op_thread = 1;
  if (held) log_.move_to(during, before);  // the release's frees landed first
  drop_model(hi);
  if (!held) fail("a release over an idle limit of 0 freed nothing");
  m_.close_cache(ci);
  cur_[c] = m_.new_cache(model_rounding{}, unlimited, true);
  all.release_held_destroyed += 1;
}

void session::late_requests(int t, const char* where) {
  op_thread = t;
  for (int c = 0; c < 2; ++c) {
    const int hi = static_cast<int>((seed_ + static_cast<std::uint64_t>(c)) % handle_count);
    const int b = static_cast<int>((steps_ + static_cast<std::size_t>(c)) & 1);
    const std::size_t bytes = raw_sizes[(seed_ + steps_ + static_cast<std::size_t>(c)) % std::size(raw_sizes)];
    trace("{}: cache {}.allocate({} B, backend {}) -> handle {}", where, c, bytes, b, hi);
    pre_drop_verify(hi);
    const std::uint64_t stamp = next_stamp();
    void* got = nullptr;
    const result r = attempt([&] {
      rp::data_ref ref = cache_[c]->allocate(be_[b], bytes);
      got = ref.data();
      fill(got, 0, bytes, stamp);
      h_[hi] = std::move(ref);
    });
    std::uint64_t gid = 0;
    std::size_t oom = 0;
    const outcome want = m_.allocate_direct(b, bytes, nullptr, gid, oom);
    expect(r, want, fmt::format("{}: a cache-level request (served without a cache)", where).c_str());
    if (want == outcome::out_of_memory) check_oom(r, oom);
    if (want != outcome::ok) continue;
    accept_block(gid, got, stamp, where);
    drop_model(hi);
    mh_[hi] = model_handle{};
    mh_[hi].kind = ref_kind;
    mh_[hi].gid = gid;
  }
  const int victim = static_cast<int>((seed_ + 5) % handle_count);
  trace("{}: drop handle {}", where, victim);
  pre_drop_verify(victim);
  expect(attempt([&] { h_[victim] = std::monostate{}; }), outcome::ok, "a release after the thread's teardown");
  drop_model(victim);
  if (!pointers_.empty()) free_kept(0, pointers_.size() - 1);  // runs here: on(0) runs inline
  op_thread = t;
}

void session::requests_after_thread_end() {
  // A cache of its own, on a backend the model does not see, gives the new thread refpool's state
  // (and the process refpool's key) before the late key is set.
  const rp::backend own = rp::make_host_backend();
  rp::alloc_cache own_cache{rp::cache_options{}};
  std::function<void()> job = [&] { late_requests(2, "a pthread key's destructor, after refpool's"); };
  std::thread ending([&] {
    (void)own_cache.allocate(own, 64);
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, make_late_key);
    if (pthread_setspecific(late_key, &job) != 0) fail("pthread_setspecific failed");
  });
  ending.join();
  check_all();
  all.thread_end_requests += 1;
}

void session::requests_after_process_end() {
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) fail("fork() failed");
  if (child == 0) {
    static session* self = nullptr;
    self = this;
    std::atexit([] {
      session& s = *self;
      s.late_requests(0, "an atexit handler, after the main thread's thread_locals");
      if (!s.frames_[0].empty()) {  // a scope's lease is not the thread's state: served from its slot
        const int hi = static_cast<int>((s.seed_ + 3) % handle_count);
        s.pre_drop_verify(hi);
        const std::uint64_t stamp = s.next_stamp();
        void* got = nullptr;
        const result r = attempt([&] {
          rp::data_ref ref = rp::allocate(s.be_[0], 96);
          got = ref.data();
          s.fill(got, 0, 96, stamp);
          s.h_[hi] = std::move(ref);
        });
        std::uint64_t gid = 0;
        std::size_t oom = 0;
        const outcome want = s.m_.allocate(0, 0, 96, nullptr, gid, oom);
        s.expect(r, want, "allocate() in a scope, after the main thread's thread_locals");
        if (want == outcome::ok) {
          s.accept_block(gid, got, stamp, "allocate() after the main thread's thread_locals");
          s.drop_model(hi);
          s.mh_[hi] = model_handle{};
          s.mh_[hi].kind = ref_kind;
          s.mh_[hi].gid = gid;
        }
      }
      s.check_all();
      std::fflush(nullptr);
      _exit(0);
    });
    std::exit(0);
  }
  int status = 0;
  pid_t waited = -1;
  do {  // libFuzzer's once-a-second SIGALRM (its -timeout check) interrupts a wait for a slow child
    waited = waitpid(child, &status, 0);
  } while (waited == -1 && errno == EINTR);
  if (waited != child) fail(fmt::format("waitpid() failed: {}", std::strerror(errno)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail(fmt::format("the process's teardown (a forked child running requests after exit()) ended with {} {}",
                     WIFEXITED(status) ? "status" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status)));
  all.process_end_requests += 1;
}

}  // namespace refpool::test::fuzz
