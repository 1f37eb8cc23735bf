// Requests after a thread's or the process's teardown (docs/design.md, "Lifetimes"): from
// thread_local destructors that run after refpool's own (on worker threads), and from static
// destructors, which glibc runs after the main thread's thread_local destructors. Each request is
// served (without a cache once the thread's teardown began) or refused with a clear error, never
// undefined behaviour: ASan, UBSan and TSan see every access, and the checks here see every buffer
// come back and every byte stay its owner's. Not Catch2: the cases run in destructors, after main
// returns; a failed check makes the process exit with status 1 (from the last destructor).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <unistd.h>

#include <refpool/cuda.hpp>
#include <refpool/hip.hpp>
#include <refpool/pointer.hpp>
#include <refpool/refpool.h>
#include <refpool/refpool.hpp>

using namespace refpool;

namespace {

std::atomic<int> failures{0};
std::atomic<int> cases_run{0};

void check(bool ok, const char* what, const char* where) {
  if (ok) return;
  std::fprintf(stderr, "FAILED (%s): %s\n", where, what);
  failures.fetch_add(1);
}

/// A buffer filled with `fill`, checked before it goes.
void write_and_check(const data_ref& r, int fill, const char* where) {
  check(r.bytes() != 0 && r.data() != nullptr, "a request was served", where);
  std::memset(r.data(), fill, r.bytes());
  const auto* bytes = static_cast<const unsigned char*>(r.data());
  check(bytes[0] == fill && bytes[r.bytes() - 1] == fill, "the buffer kept its bytes", where);
}

/// What a program may do with refpool, once each: requests at cache level, in a scope, in a
/// step with and without a plan key, by pointer; releases; stats; the C API with an error.
void use_everything(alloc_cache& cache, const backend& be, const char* where) {
  write_and_check(cache.allocate(be, 4096), 1, where);
  write_and_check(cache.allocate(host_backend(), 2000), 8, where);  // the process-wide host backend
  {
    scope s(cache);
    write_and_check(allocate(be, 512), 2, where);
    const data_ref kept = allocate(be, 1000);
    write_and_check(kept, 3, where);
  }
  for (int i = 0; i < 2; ++i) {
    step st(cache);  // no key: planned under the cache's own (auto_plans)
    write_and_check(cache.allocate(be, 1024), 4, where);
    write_and_check(cache.allocate(be, 2048), 5, where);
  }
  {
    step st(cache, {.plan = "teardown"});
    write_and_check(cache.allocate(be, 300), 6, where);
  }
  void* p = to_pointer(cache.allocate(be, 256));
  std::memset(p, 7, 256);
  const data_ref again = pointer_ref(p);
  check(again.data() == p, "pointer_ref finds the buffer", where);
  free_pointer(p);
  bool refused = false;
  try {
    free_pointer(p);  // a double free: a clear error
  } catch (const invalid_argument&) {
    refused = true;
  }
  check(refused, "a double free is refused", where);
  (void)cache.stats();
  cache.reclaim(0);
  // The C API keeps its last error per thread.
  check(refpool_free(p) != REFPOOL_OK, "the C API refuses a double free", where);
  const char* message = refpool_last_error();
  check(message != nullptr && std::strstr(message, "refpool") != nullptr, "the C API's error says what happened",
        where);
  cases_run.fetch_add(1);
}

/// What the library makes at its first use and must keep past static destruction: the option
/// names of configuration errors (C and C++) and each GPU runtime's state (why it is unavailable).
/// Called first from main, after the static objects whose destructors call it again.
void use_what_is_made_at_first_use(const char* where) {
  refpool_cache_options options;
  check(refpool_cache_options_init(&options, sizeof options) == REFPOOL_OK, "the C options are made", where);
  check(refpool_cache_options_set(&options, sizeof options, "colour", "blue") == REFPOOL_ERROR_CONFIG,
        "an unknown option is refused", where);
  check(std::strstr(refpool_last_error(), "max_idle_bytes") != nullptr, "the error lists the options", where);
  bool refused = false;
  try {
    cache_options{}.apply("colour:blue");
  } catch (const config_error& e) {
    refused = std::strstr(e.what(), "max_idle_bytes") != nullptr;
  }
  check(refused, "an unknown option in a conf string is refused, listing the options", where);
  // Both runtimes: unavailable here (no GPU, or built without them) with a reason, else usable.
  check(cuda::available() == cuda::unavailable_reason().empty(), "CUDA says whether it is usable", where);
  check(hip::available() == hip::unavailable_reason().empty(), "HIP says whether it is usable", where);
}

/// What a thread or the process keeps past its teardown: a cache, a buffer from before and a
/// buffer handed over by pointer, used and released from a destructor.
struct late_user {
  const char* where = "";
  const backend* be = nullptr;
  alloc_cache* cache = nullptr;
  data_ref kept;
  void* handed = nullptr;

  void keep(alloc_cache& c, const backend& b, const char* name) {
    where = name;
    be = &b;
    cache = &c;
    kept = c.allocate(b, 768);
    write_and_check(kept, 9, where);
    handed = to_pointer(c.allocate(b, 640));
  }
  void use_and_release() {
    if (cache == nullptr) return;
    use_everything(*cache, *be, where);
    write_and_check(kept, 10, where);
    kept.reset();
    free_pointer(handed);
    cache = nullptr;
  }
  ~late_user() { use_and_release(); }
};

/// The calling thread's late_user, made at the first call: before the thread's first request, its
/// destructor runs after refpool gave the thread's leases and kept router back; after it, before.
late_user& thread_user() {
  thread_local late_user user;
  return user;
}

void worker(alloc_cache& cache, const backend& be, bool made_first) {
  if (made_first) thread_user().keep(cache, be, "a thread_local destroyed after refpool's");
  {
    step st(cache);  // the thread keeps this step's router
    write_and_check(cache.allocate(be, 1024), 11, "a worker");
  }
  write_and_check(cache.allocate(be, 4096), 12, "a worker");
  if (!made_first) thread_user().keep(cache, be, "a thread_local destroyed before refpool's");
}

/// Destroyed after the main thread's thread_locals, with the static objects: uses the cache, then
/// destroys it and releases buffers of it, then checks that everything came back.
struct process_user {
  std::unique_ptr<backend> be;
  std::unique_ptr<alloc_cache> cache;
  late_user user;
  data_ref from_main;

  ~process_user() {
    if (!cache) return;
    use_what_is_made_at_first_use("a static destructor");
    use_everything(*cache, *be, "a static destructor");
    user.use_and_release();
    data_ref outliving = cache->allocate(*be, 1536);
    cache.reset();
    write_and_check(outliving, 13, "a static destructor, after its cache");
    write_and_check(from_main, 14, "a static destructor, after its cache");
    outliving.reset();
    from_main.reset();
    check(be->outstanding_bytes() == 0, "every buffer went back to the backend", "the end");
    check(cases_run.load() == 5, "every case ran", "the end");
    std::fprintf(stderr, "teardown: %d cases, %d failures\n", cases_run.load(), failures.load());
    if (failures.load() != 0) _exit(1);
  }
};

}  // namespace

int main() {
  static process_user process;  // destroyed after main's thread_locals, with the static objects
  process.be = std::make_unique<backend>(make_host_backend());
  process.cache = std::make_unique<alloc_cache>(cache_options{});
  const backend& be = *process.be;
  alloc_cache& cache = *process.cache;
  use_what_is_made_at_first_use("main");  // made now: destroyed before `process` unless kept
  thread_user().keep(cache, be, "a thread_local of the main thread");
  // The main thread holds a lease and a kept router when it ends.
  {
    step st(cache);
    write_and_check(cache.allocate(be, 1024), 15, "main");
  }
  process.from_main = cache.allocate(be, 4096);
  process.user.keep(cache, be, "a static destructor, with buffers from main");
  std::thread(worker, std::ref(cache), std::cref(be), true).join();
  std::thread(worker, std::ref(cache), std::cref(be), false).join();
  check(cases_run.load() == 2, "both workers' thread_locals ran", "main");
  return 0;
}
