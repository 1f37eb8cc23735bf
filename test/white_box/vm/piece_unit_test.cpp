// Issue 23, row 7: the piece unit of a backend (which the cache's keys are rounded to) and the
// segment heap's own check of its options are one rule (choose_piece_unit), so a backend the
// cache gives segments to always gets a heap. A backend aligned to 4 MiB got config_error on
// every allocation with segments on: its keys took a 4 MiB unit that the heap then refused.
#include <catch2/catch.hpp>

#include <cstdint>
#include <new>

#include <refpool/refpool.hpp>

#include "access.hpp"
#include "backend_state.hpp"
#include "cache/piece_units.hpp"
#include "segments/segment_heap.hpp"
#include "support/forwarding_resource.hpp"

using namespace refpool;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// Host memory that says it is aligned to `alignment` (and is), with the host's virtual memory.
class aligned_resource final : public test::forwarding_resource {
 public:
  explicit aligned_resource(std::size_t alignment) : alignment_(alignment) {}
  std::string_view name() const noexcept override { return "host (aligned)"; }
  std::size_t alignment() const noexcept override { return alignment_; }
  void* allocate(std::size_t bytes, stream_ref) override {
    return ::operator new (bytes, std::align_val_t{alignment_}, std::nothrow);
  }
  void deallocate(void* ptr, std::size_t, stream_ref) noexcept override {
    ::operator delete (ptr, std::align_val_t{alignment_});
  }
  virtual_memory* address_space() noexcept override { return upstream_->address_space(); }

 private:
  std::size_t alignment_;
};

bool heap_builds(const backend& be) {
  try {
    detail::segment_heap heap(be);
    return true;
  } catch (const config_error&) {
    return false;
  }
}

}  // namespace

TEST_CASE("row 7: the cache gives a backend segments exactly when a heap can serve it", "[vm][segments]") {
  // Every power of two from 1 B to 1 GiB, and a few that are not.
  std::vector<std::size_t> alignments{3, 768, 3 * MiB};
  for (std::size_t a = 1; a <= (std::size_t{1} << 30); a *= 2) alignments.push_back(a);
  std::size_t segmented = 0;
  for (const std::size_t a : alignments) {
    CAPTURE(a);
    const backend be(std::make_shared<aligned_resource>(a));
    const std::size_t unit = detail::piece_unit(*detail::access::state(be), segment_policy::on);
    CHECK((unit != 1) == heap_builds(be));
    if (unit != 1) {
      ++segmented;
      CHECK(unit == std::max<std::size_t>(a, 512));
    }
  }
  CHECK(segmented == 19);  // 1 B .. 256 KiB: larger units than small_max would cost every small request a unit
}

TEST_CASE("row 7: a backend aligned to 4 MiB allocates with segments on (plain blocks)", "[vm][segments]") {
  for (const std::size_t a : {256 * KiB, MiB, 4 * MiB, 64 * MiB}) {
    CAPTURE(a);
    const backend be(std::make_shared<aligned_resource>(a));
    cache_options o;
    o.segments = segment_policy::on;
    alloc_cache cache{o};
    {
      const data_ref small = cache.allocate(be, 4 * KiB, {});
      const data_ref large = cache.allocate(be, 3 * MiB, {});
      CHECK(reinterpret_cast<std::uintptr_t>(small.data()) % a == 0);
      CHECK(reinterpret_cast<std::uintptr_t>(large.data()) % a == 0);
      // 256 KiB units (small_max) keep segments (a piece is a multiple of the unit); larger ones
      // plain blocks.
      CHECK((cache.stats().segments != 0) == (a == 256 * KiB));
    }
    cache.reclaim();
    CHECK(be.outstanding_bytes() == 0);
  }
}
