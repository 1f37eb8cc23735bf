// A hostile review of thread teardown and cache lifetimes (issue 35's classes "process and thread
// exit" and "counted references only"), from outside: requests from pthread key destructors, C API
// errors there, caches destroyed and made again at the same address while other threads request,
// step and read stats through them, threads that switch between two caches' steps, and fork()
// children. Each case failed once, or is a guard for one that held. Under ASan a leak fails the
// program (LSan); TSan (CI) sees the races. REFPOOL_HOSTILE_ROUNDS scales the soaks (default: a
// few rounds, well under a second each).
#include <catch2/catch.hpp>

#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <refpool/pointer.hpp>
#include <refpool/refpool.h>
#include <refpool/refpool.hpp>

using namespace refpool;

namespace {

/// Runs `body` in a pthread key's destructor of a new thread that does nothing else: the
/// thread's first call into refpool comes after its thread_local destructors ran. `argument`
/// must not be null (a key's destructor runs only for a value).
void in_key_destructor_of_a_new_thread(void (*body)(void*), void* argument) {
  pthread_key_t key;
  REQUIRE(pthread_key_create(&key, body) == 0);
  std::thread([&] { pthread_setspecific(key, argument); }).join();
  pthread_key_delete(key);
}

}  // namespace

TEST_CASE("hostile: a thread whose first request comes from a pthread key's destructor gives its lease back",
          "[hostile][teardown][threads]") {
  // The holdings a key destructor makes must go back at the thread's end all the same: kept, they
  // would keep a slot leased to a thread that is gone (and its cache's state, until the process
  // ends: LSan reports it). The slot given back is the next thread's, with its idle block.
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  struct context {
    alloc_cache* cache;
    const backend* be;
  } c{&cache, &be};
  in_key_destructor_of_a_new_thread(
      [](void* p) {
        auto& [cache, be] = *static_cast<context*>(p);
        data_ref r = cache->allocate(*be, 4096);
        std::memset(r.data(), 1, r.bytes());
        step st(*cache);  // the thread keeps this step's router too
        data_ref in_step = cache->allocate(*be, 8192);
        std::memset(in_step.data(), 2, in_step.bytes());
      },
      &c);
  std::thread([&] {
    data_ref again = cache.allocate(be, 4096);  // the slot the key destructor's thread gave back
    std::memset(again.data(), 3, again.bytes());
  }).join();
  const cache_stats stats = cache.stats();
  CHECK(stats.steals == 0);  // a slot still leased to the gone thread: the block is stolen from it
  CHECK(stats.live_blocks == 0);
}

TEST_CASE("hostile: a C API error from a pthread key's destructor keeps its message and leaks nothing",
          "[hostile][teardown][c-api]") {
  static std::string seen;
  in_key_destructor_of_a_new_thread(
      [](void*) {
        int not_refpools = 0;
        if (refpool_free(&not_refpools) == REFPOOL_ERROR_INVALID_ARGUMENT) seen = refpool_last_error();
      },
      &seen);
  CHECK(seen.find("refpool") != std::string::npos);
}
