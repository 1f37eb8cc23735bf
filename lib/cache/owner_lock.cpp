// The intruder's side of owner_lock and the choice of mode.
#include "cache/owner_lock.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>
#include <thread>

namespace refpool::detail {

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool under_tsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool under_tsan = true;
#else
constexpr bool under_tsan = false;
#endif
#else
constexpr bool under_tsan = false;
#endif

int membarrier(int command) noexcept { return static_cast<int>(syscall(__NR_membarrier, command, 0, 0)); }

void heavy_barrier() noexcept {
  // Registered in process_mode(); cannot fail after a successful registration.
  membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
}

}  // namespace

const owner_lock::mode owner_lock::owner_lock_mode = owner_lock::choose_mode();

owner_lock::mode owner_lock::choose_mode() noexcept {
  if (under_tsan) return mode::spinlock;
  if (const char* forced = std::getenv("REFPOOL_OWNER_LOCK")) {
    const std::string_view name = forced;
    if (name == "spinlock") return mode::spinlock;
    if (name == "fence") return mode::fence;
  }
  const int supported = membarrier(MEMBARRIER_CMD_QUERY);
  if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return mode::fence;
  return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 ? mode::membarrier : mode::fence;
}

void owner_lock::begin_intrusion() noexcept {
  gate_.lock();
  if (owner_lock_mode != mode::spinlock) intruding_.store(true, std::memory_order_relaxed);
}

void owner_lock::barrier() noexcept {
  switch (owner_lock_mode) {
    case mode::membarrier: heavy_barrier(); break;
    case mode::fence: std::atomic_thread_fence(std::memory_order_seq_cst); break;
    case mode::spinlock: break;  // the owner takes gate_ too
  }
}

void owner_lock::wait_until_owner_out() noexcept {
  for (int spins = 0; busy_.load(std::memory_order_acquire); ++spins) {
    if (spins > 64) std::this_thread::yield();
  }
}

}  // namespace refpool::detail
