// One fuzz input and what runs it (the session), shared by the files that define it:
// setup.cpp (backends, caches, options, the operation loop), op_table.cpp (which byte runs which
// operation), checks.cpp (refpool against the model after every operation), cleanup.cpp (the
// input's end, its counts), and the operations: alloc_ops.cpp (requests), handle_ops.cpp (what
// owners do with handles), scope_ops.cpp (scopes, guards, steps), cache_ops.cpp (reclaim, limits,
// faults, a cache made again), plan_loop_ops.cpp (planned loops and sweeps), in_flight.cpp (a
// request held in the backend while the other thread acts), pointer_ops.cpp (free by pointer:
// re-hand-outs, stale and racing frees), configure_ops.cpp (configure calls that fail) and
// teardown_ops.cpp (at the input's end: a release's eviction racing close(), requests after a
// thread's and the process's teardown).
// harness.cpp runs an input and reports a mismatch. Internal to the fuzzer.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <refpool/refpool.hpp>
#include "support/fault_injection.hpp"

#include "harness.hpp"
#include "model.hpp"
#include "segment_shadow.hpp"
#include "tracking_resource.hpp"

namespace refpool::test::fuzz {

namespace rp = ::refpool;

// ---- element types ------------------------------------------------------------------------

struct rgb {
  std::uint8_t r, g, b;
};
struct vec3 {
  float x, y, z;
};
static_assert(sizeof(rgb) == 3 && sizeof(vec3) == 12);

using handle = std::variant<std::monostate, rp::array<std::uint8_t>, rp::array<std::uint16_t>, rp::array<float>,
                            rp::array<double>, rp::array<std::uint64_t>, rp::array<rgb>, rp::array<vec3>, rp::data_ref>;
constexpr int type_count = 7;  // handle index 1 + type
constexpr int ref_kind = 8;    // handle index of data_ref
constexpr std::size_t elem_size[type_count] = {1, 2, 4, 8, 8, 3, 12};
constexpr std::size_t elem_align[type_count] = {1, 2, 4, 8, 8, 1, 4};
constexpr const char* type_name[type_count] = {"u8", "u16", "float", "double", "u64", "rgb", "vec3"};

// The data_ref behind any handle (an empty one for an empty handle).
inline const rp::data_ref& ref_of(const handle& h) {
  return std::visit(
      [](const auto& x) -> const rp::data_ref& {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, std::monostate>) {
          static const rp::data_ref none;
          return none;
        } else if constexpr (std::is_same_v<X, rp::data_ref>) {
          return x;
        } else {
          return x.ref();
        }
      },
      h);
}

template <class F>
void with_type(int type, F&& f) {
  switch (type) {
    case 0: f.template operator()<std::uint8_t>(); break;
    case 1: f.template operator()<std::uint16_t>(); break;
    case 2: f.template operator()<float>(); break;
    case 3: f.template operator()<double>(); break;
    case 4: f.template operator()<std::uint64_t>(); break;
    case 5: f.template operator()<rgb>(); break;
    default: f.template operator()<vec3>(); break;
  }
}

// ---- tunables -----------------------------------------------------------------------------

constexpr int handle_count = 12;              // handle slots shared by both threads
constexpr std::size_t max_depth = 8;          // scopes and guards per thread
constexpr std::size_t max_operations = 4096;  // per input
constexpr std::size_t backend0_capacity = std::size_t{1} << 20;
// Element counts: few distinct byte sizes over 7 element types, so requests meet idle blocks often.
constexpr std::size_t counts[] = {16, 16, 16, 16, 64, 64, 64, 256, 0, 1, 2, 4, 8, 32, 128, 512, 3, 12, 24, 100};
constexpr std::size_t raw_sizes[] = {8, 16, 24, 32, 48, 64, 96, 100, 128, 256, 512, 1000, 1024, 4096};
constexpr std::size_t keeps[] = {0, 256, 1024, 4096, 16384, unlimited};
constexpr std::size_t limits[] = {unlimited, unlimited, unlimited, unlimited, unlimited, unlimited,
                                  unlimited, unlimited, unlimited, unlimited, unlimited, unlimited,
                                  0,         1024,      4096,      16384};
constexpr std::size_t huge = std::numeric_limits<std::size_t>::max();

// ---- reporting ----------------------------------------------------------------------------

extern totals all;
extern bool tracing;   // REFPOOL_FUZZ_TRACE: print every operation
extern int op_thread;  // the thread of the operation running now, for reports
// Where the input is, for fail()'s report: set by run_op, cleanup and run_input.
extern std::uint64_t op_index;
extern std::size_t op_code;  // which operation of the table; -1: setup and cleanup
extern bool in_cleanup;

template <class... Args>
inline void trace(fmt::format_string<Args...> format, Args&&... args) {
  if (tracing) fmt::print(stderr, "  {}\n", fmt::format(format, std::forward<Args>(args)...));
}

inline std::uint8_t pattern(std::uint64_t stamp, std::size_t i) noexcept {
  return static_cast<std::uint8_t>((stamp + (i >> 3) * 0x9E3779B97F4A7C15ull) >> ((i & 7) * 8));
}

inline std::uint64_t splitmix(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// ---- the helper thread ----------------------------------------------------------------------

class helper_thread {
 public:
  helper_thread() : thread_([this] { loop(); }) {}
  ~helper_thread() {
    {
      std::lock_guard guard(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  /// Runs `job` on the helper and waits for it.
  void run(const std::function<void()>& job) {
    start(job);
    finish();
  }
  /// Starts `job` (which must outlive finish()) on the helper and returns at once.
  void start(const std::function<void()>& job) {
    std::lock_guard lock(mutex_);
    job_ = &job;
    done_ = false;
    cv_.notify_all();
  }
  [[nodiscard]] bool finished() {
    std::lock_guard lock(mutex_);
    return done_;
  }
  void finish() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || job_ != nullptr; });
      if (stop_) return;
      const std::function<void()>* job = job_;
      lock.unlock();
      (*job)();
      lock.lock();
      job_ = nullptr;
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;
  bool done_ = false;
  bool stop_ = false;
  std::thread thread_;
};

/// The one helper thread of the process (thread 1 of every input).
helper_thread& helper();

// ---- running one call and classifying what it threw ---------------------------------------

struct result {
  outcome got = outcome::ok;
  std::string message;
  std::size_t oom_bytes = 0;
  int oom_device = 0;
  int native_code = 0;
};

template <class F>
result attempt(F&& f) {
  result r;
  try {
    f();
  } catch (const rp::size_error& e) {
    r = {outcome::size_error, e.what()};
  } catch (const rp::shape_error& e) {
    r = {outcome::shape_error, e.what()};
  } catch (const rp::use_after_free& e) {
    r = {outcome::use_after_free, e.what()};
  } catch (const rp::out_of_memory& e) {
    r = {outcome::out_of_memory, e.what(), e.requested_bytes(), e.device()};
  } catch (const rp::backend_error& e) {
    r = {outcome::backend_error, e.what()};
    r.native_code = e.native_code();
  } catch (const rp::scope_error& e) {
    r = {outcome::scope_error, e.what()};
  } catch (const rp::config_error& e) {
    r = {outcome::config_error, e.what()};
  } catch (const rp::invalid_argument& e) {
    r = {outcome::invalid_argument, e.what()};
  } catch (const rp::error& e) {
    r = {outcome::error, e.what()};
  } catch (const std::exception& e) {
    r = {outcome::other, e.what()};
  }
  return r;
}

// ---- decoding -----------------------------------------------------------------------------

class reader {
 public:
  reader(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }
  std::uint8_t byte() noexcept {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  /// A number below `k` (0 when k <= 1).
  std::size_t below(std::size_t k) noexcept {
    if (k <= 1) return 0;
    if (k <= 256) return byte() % k;
    const std::size_t v = byte() | static_cast<std::size_t>(byte()) << 8;
    return v % k;
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

// Element count of dims and their bytes, as shape.hpp and array.hpp document them.
inline outcome checked_bytes(const std::vector<std::size_t>& dims, std::size_t elem, std::size_t& count,
                             std::size_t& bytes) {
  count = 1;
  if (std::find(dims.begin(), dims.end(), std::size_t{0}) != dims.end()) {
    count = bytes = 0;
    return outcome::ok;
  }
  for (std::size_t d : dims)
    if (__builtin_mul_overflow(count, d, &count)) return outcome::size_error;
  if (__builtin_mul_overflow(count, elem, &bytes)) return outcome::size_error;
  return outcome::ok;
}

inline rp::shape to_shape(const std::vector<std::size_t>& dims) {
  return rp::shape(std::span<const std::size_t>(dims));
}

struct model_handle {
  int kind = 0;  ///< variant index
  std::uint64_t gid = 0;
  bool freed = false;
  void* freed_ptr = nullptr;
  std::size_t freed_bytes = 0;
  std::size_t size = 0;  ///< elements (arrays)
  std::size_t offset = 0;
  std::vector<std::size_t> dims;
};

struct real_frame {
  std::unique_ptr<rp::scope> scope;
  std::unique_ptr<rp::uncached_guard> guard;
  void close() const { scope ? scope->close() : guard->close(); }
};

// ---- one input ----------------------------------------------------------------------------

class session {
 public:
  session(const std::uint8_t* data, std::size_t size) : in_(data, size) {}
  void run();

 private:
  using op = void (session::*)(int);

  // Setup and teardown.
  void make_backends();
  rp::cache_options decode_options(int thread, model_rounding& rounding);
  void cleanup();
  // Ends the operations cannot make, at the input's end (teardown_ops.cpp).
  void teardown_scenario();
  void release_while_destroyed();
  void requests_after_thread_end();
  void requests_after_process_end();
  void late_requests(int t, const char* where);

  // Operations; the argument is the thread that runs it.
  void op_alloc(int t);
  void op_alloc_raw(int t);
  void op_alloc_misuse(int t);
  void op_drop(int t);
  void op_copy(int t);
  void op_move(int t);
  void op_ref_out(int t);
  void op_reshape(int t);
  void op_reinterpret(int t);
  void op_view(int t);
  void op_unsafe_free(int t);
  void op_access(int t);
  void op_write(int t);
  void op_record_stream(int t);
  void op_to_pointer(int t);
  void op_free_pointer(int t);
  void op_scope(int t);
  void op_step(int t);
  void op_cache_alloc(int t);
  void op_guard(int t);
  void op_close(int t);
  void op_close_misuse(int t);
  void op_reclaim(int t);
  void op_set_limit(int t);
  void op_arm(int t);
  void op_recreate(int t);
  void op_verify(int t);
  void op_repeat(int t);
  void op_planned_loop(int t);
  void op_plan_sweep(int t);
  void plan_stream(int t, int c, bool as_step, bool then_shapes);
  void plan_shapes(int t, int c, bool as_step, bool prefixes);
  void stream_run(int t, int c, bool as_step, const std::vector<std::size_t>& sizes,
                  const std::string& key = "stream");
  void pause_long(int t, int c, bool as_step);
  void open_key_scope(int t, int c, const std::string& key, const char* what);
  void open_late_scope(int u, int c, std::vector<std::pair<rp::data_ref, std::uint64_t>>& live);
  void close_late_scopes(int u, std::vector<std::pair<rp::data_ref, std::uint64_t>>& live);
  void op_in_flight(int t);
  void op_racing_frees(int t);
  void op_failing_configure(int t);
  void hand_over(int t, int handle);
  void stale_free(int t);
  void loop_step(int t, bool perturbed, bool holding);
  void keep_one(int t);
  void release_kept(int t, std::size_t keep);
  void run_op(op f, int t, std::size_t code);
  void step();

  // Helpers.
  template <class F>
  result on(int t, F&& f);
  void expect(const result& r, outcome want, const char* what);
  int pick_handle() { return static_cast<int>(in_.below(handle_count)); }
  /// No plan (half the time) or one of three keys: few enough that runs of a key repeat.
  std::string pick_key() {
    const std::size_t k = in_.below(6);
    return k < 3 ? std::string() : fmt::format("key{}", k - 3);
  }
  std::size_t pick_count() { return counts[in_.below(std::size(counts))]; }
  void* pick_stream() {
    const std::size_t s = in_.below(8);
    if (loop_backend_ >= 0 && s != 7) return loop_stream_;  // a planned loop's stream, mostly
    return s < 6 ? nullptr : reinterpret_cast<void*>(static_cast<std::uintptr_t>(s - 5) << 12);
  }
  int pick_backend() {
    const std::size_t b = in_.below(8);
    if (loop_backend_ >= 0) return b == 7 ? 1 - loop_backend_ : loop_backend_;  // a planned loop's, mostly
    return b == 0 ? 1 : 0;
  }
  std::vector<std::size_t> make_dims(std::size_t count);
  std::vector<std::size_t> overflow_dims();
  std::uint64_t next_stamp() { return splitmix(++stamps_ ^ seed_); }
  void fill(void* ptr, std::size_t from, std::size_t bytes, std::uint64_t stamp);
  void verify_block(std::uint64_t gid, const char* when);
  void verify_all(const char* when);
  void pre_drop_verify(int i);
  void drop_model(int i);
  void accept_block(std::uint64_t gid, void* got, std::uint64_t stamp, const char* what);
  void check_handle(int i);
  void check_all();
  void check_oom(const result& r, std::size_t bytes);

  reader in_;
  std::uint64_t seed_ = 0;
  event_log log_;
  model m_{log_};
  call_gate gate_;  // holds a helper thread's backend call in flight (op_in_flight); outlives be_
  std::shared_ptr<rp::limiting_resource> limited_[backends];
  std::shared_ptr<rp::failing_resource> failing_[backends];
  rp::backend be_[backends];
  std::unique_ptr<rp::alloc_cache> cache_[2];
  std::unique_ptr<rp::step> open_steps_[2];  // an open step per cache slot (it may outlive its cache)
  int step_cache_[2] = {-1, -1};             // the model cache it belongs to
  std::vector<std::pair<std::unique_ptr<rp::step>, int>> old_steps_;  // steps of destroyed caches
  // Extra references a planned loop takes and drops in rounds after the first, so that buffers
  // live longer than the recording said (late releases) or past their run (escapes).
  std::vector<std::pair<rp::data_ref, std::uint64_t>> kept_;
  std::uint64_t perturb_ = 0;
  // While a planned loop runs: its requests' usual backend and stream (so its sequences can be
  // planned) and, for a loop of steps, the cache its requests go to.
  int loop_backend_ = -1;
  void* loop_stream_ = nullptr;
  int loop_cache_ = -1;
  int cur_[2] = {-1, -1};
  std::unique_ptr<segment_shadow> shadow_;  // a third cache, with segments (segment_shadow.hpp)
  std::vector<real_frame> frames_[threads];
  handle h_[handle_count];
  model_handle mh_[handle_count];
  /// Buffers handed to to_pointer and not freed yet, one entry per hand-over. The table holds one
  /// reference per buffer however many hand-overs it keeps: the model counts one for the first.
  struct kept_pointer {
    void* ptr;
    std::uint64_t gid;
  };
  std::vector<kept_pointer> pointers_;
  /// Addresses whose last hand-over was freed (for stale frees), while refpool still owns them: a
  /// cached block (`gid`), or a region of an arena still allocated (`arena`).
  struct freed_pointer {
    void* ptr;
    std::uint64_t gid;
    int arena;
  };
  std::vector<freed_pointer> freed_pointers_;
  [[nodiscard]] int arena_at(const void* ptr) const;
  void forget_returned_addresses();
  [[nodiscard]] bool kept(std::uint64_t gid) const {
    return std::any_of(pointers_.begin(), pointers_.end(), [&](const kept_pointer& k) { return k.gid == gid; });
  }
  void free_kept(int t, std::size_t i);
  std::uint64_t stamps_ = 0;
  std::size_t steps_ = 0;
  bool repeating_ = false;
};

template <class F>
result session::on(int t, F&& f) {
  op_thread = t;
  if (t == 0) return attempt(f);
  result r;
  helper().run([&] { r = attempt(f); });
  return r;
}

}  // namespace refpool::test::fuzz
