// A heap over real host memory with every observer and injector a segment test needs:
// segment_heap -> failing_resource -> tracking_resource -> limiting_resource -> host resource.
// Faults are injected above the tracker (it never sees them); the limit refuses below it (it
// counts the refusals), so a test can tell an injected failure from a real out-of-memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>

#include <refpool/adaptors.hpp>
#include <refpool/backend.hpp>
#include "support/fault_injection.hpp"

#include "segments/segment_heap.hpp"
#include "tracking_resource.hpp"

namespace refpool::test {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

struct heap_fixture {
  /// `kind`: the memory kind the backend reports (the memory stays host memory); `vm`: whether it
  /// offers the host's virtual memory.
  explicit heap_fixture(std::size_t limit = std::size_t{1} << 30, std::optional<memory_kind> kind = {}, bool vm = true)
      : limited(std::make_shared<limiting_resource>(make_host_resource(), limit)),
        tracker(std::make_shared<tracking_resource>(limited, kind, vm)),
        failing(std::make_shared<failing_resource>(tracker)),
        be(failing) {}

  std::shared_ptr<limiting_resource> limited;
  std::shared_ptr<tracking_resource> tracker;
  std::shared_ptr<failing_resource> failing;
  backend be;
};

/// The heap's tests are written against a small pool of requests up to 1 MiB (PyTorch's split,
/// and the heap's default before it became 256 KiB): the split itself is what they test, not the
/// default's value.
inline detail::segment_heap_options test_heap_options() {
  detail::segment_heap_options o;
  o.small_max = MiB;
  return o;
}

/// No virtual memory: segments are backend allocations.
inline detail::segment_heap_options plain_options() {
  detail::segment_heap_options o = test_heap_options();
  o.use_virtual_memory = false;
  return o;
}

/// Virtual memory with reservations small enough to fill in a test.
inline detail::segment_heap_options vm_options(std::size_t reserve = 64 * MiB, std::size_t own_min = 32 * MiB) {
  detail::segment_heap_options o = test_heap_options();
  o.reserve_bytes = reserve;
  o.own_segment_min = own_min;
  return o;
}

/// The span tests' heap: virtual memory, 256 MiB reserved a pool (span_floor: 128 MiB), no
/// segments of their own.
inline detail::segment_heap_options span_options() { return vm_options(256 * MiB, SIZE_MAX); }

inline stream_ref stream(std::uintptr_t n) { return stream_ref{reinterpret_cast<void*>(n)}; }

inline std::uintptr_t addr(const detail::segment_heap::piece& p) { return reinterpret_cast<std::uintptr_t>(p.address); }

/// Writes `id` every 512 bytes of the piece (every piece is a multiple of 512 B at a multiple
/// of 512 B, so two overlapping pieces share a stamp slot).
inline void stamp(const detail::segment_heap::piece& p, std::uint64_t id) {
  auto* bytes = static_cast<unsigned char*>(p.address);
  for (std::size_t off = 0; off < p.bytes; off += 512) std::memcpy(bytes + off, &id, sizeof id);
}

/// True if every stamp of the piece still reads `id`.
inline bool stamped(const detail::segment_heap::piece& p, std::uint64_t id) {
  const auto* bytes = static_cast<const unsigned char*>(p.address);
  for (std::size_t off = 0; off < p.bytes; off += 512) {
    std::uint64_t v = 0;
    std::memcpy(&v, bytes + off, sizeof v);
    if (v != id) return false;
  }
  return true;
}

}  // namespace refpool::test
