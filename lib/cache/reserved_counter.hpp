// The bytes a cache holds from its backends, all kinds together (plain blocks, segments with their
// free bytes, plan arenas, uncached buffers), with their exact peak and their totals in and out:
// what PyTorch reports as reserved memory, its maximum and its allocated / freed totals. Counted, because the plans'
// arena source may outlive the cache's reference (lib/plan/arena_source.hpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "ref_counted.hpp"

namespace refpool::detail {

/// Raises `peak` to `value` if that is higher (another thread may raise it meanwhile).
inline void raise_max(std::atomic<std::size_t>& peak, std::size_t value) noexcept {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (seen < value && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {}
}

class reserved_counter : public ref_counted<reserved_counter> {
 public:
  void add(std::size_t bytes) noexcept {
    raise_max(peak_, now_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    added_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void remove(std::size_t bytes) noexcept {
    now_.fetch_sub(bytes, std::memory_order_relaxed);
    removed_.fetch_add(bytes, std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t now() const noexcept { return now_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t added() const noexcept { return added_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t removed() const noexcept { return removed_.load(std::memory_order_relaxed); }
  void reset_peak() noexcept { peak_.store(now(), std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> now_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<std::uint64_t> added_{0};  // backend events only (misses, trims): never on a hit
  std::atomic<std::uint64_t> removed_{0};
};

}  // namespace refpool::detail
