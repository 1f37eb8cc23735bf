// What refpool does when a virtual-memory call fails (docs/design.md, "Virtual memory failure
// rules"): each call is made to fail, by injection or by a real kernel limit, and the outcome is
// checked: a fallback, out_of_memory, backend_error, or an abort where the accounting would
// otherwise be wrong; and nothing leaked. Issue 23's rows 6, 8 and 9 each have a test here that
// failed before their fix.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <refpool/refpool.hpp>
#include "support/fault_injection.hpp"

#include "access.hpp"
#include "white_box/segment_fixture.hpp"
#include "support/in_child.hpp"
#include "vm/vm_region.hpp"

using namespace refpool;
using detail::segment_heap;
using detail::vm_region;
using refpool::test::heap_fixture;
using refpool::test::KiB;
using refpool::test::MiB;
using refpool::test::vm_options;
using how = fault_schedule::failure;

namespace {

constexpr std::size_t GiB = std::size_t{1} << 30;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;  // the sanitizers map terabytes of shadow: no address-space limit fits them
#else
constexpr bool sanitized = false;
#endif

// A line of /proc/self/status, e.g. "VmSize", in bytes (its value is in kB).
std::size_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  return 0;
}

// /proc/sys/vm/overcommit_memory: 0 heuristic, 1 always, 2 strict; -1 if unreadable.
int overcommit_mode() {
  std::ifstream in("/proc/sys/vm/overcommit_memory");
  int mode = -1;
  in >> mode;
  return mode;
}

// More than the machine's RAM and swap, in granules: what the kernel refuses to one plain
// allocation under the heuristic (mode 0) and strict (mode 2) overcommit policies.
std::size_t beyond_ram_and_swap() {
  struct sysinfo info {};
  REQUIRE(sysinfo(&info) == 0);
  const std::size_t total = (static_cast<std::size_t>(info.totalram) + info.totalswap) * info.mem_unit;
  return (total + GiB) / (2 * MiB) * (2 * MiB);
}

// Whether the kernel refuses `bytes` of plain memory: a private writable mapping, what malloc
// makes for a large request (tried with mmap, so a sanitizer's allocator does not abort).
bool plain_allocation_refused(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return true;
  munmap(p, bytes);
  return false;
}

// The kernel's flags of the mapping holding `addr` (/proc/self/smaps "VmFlags"): "ac" means the
// range is charged to the commit accounting, "nr" that it was mapped with MAP_NORESERVE.
std::string vm_flags(const void* addr) {
  std::ifstream in("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(addr);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    const std::string first = line.substr(0, line.find(' '));
    const std::size_t dash = first.find('-');
    if (dash != std::string::npos && first.find_first_not_of("0123456789abcdef-") == std::string::npos)
      inside =
          std::stoul(first.substr(0, dash), nullptr, 16) <= at && at < std::stoul(first.substr(dash + 1), nullptr, 16);
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line.substr(8) + " ";
  }
  return {};
}

bool has_flag(const std::string& flags, const char* flag) {
  return flags.find(std::string(" ") + flag + " ") != std::string::npos;
}

cache_options with_segments() {
  cache_options o;
  o.segments = segment_policy::on;
  return o;
}

}  // namespace

// ---- row 9: host commits are charged ---------------------------------------------------------

TEST_CASE("row 9: a host commit is refused where a plain allocation is, instead of being handed out", "[vm][host]") {
  const auto res = make_host_resource();
  virtual_memory& vm = *res->address_space();
  const std::size_t bytes = beyond_ram_and_swap();
  const bool refused = plain_allocation_refused(bytes);
  const int mode = overcommit_mode();
  INFO("overcommit_memory " << mode << ", " << bytes / GiB << " GiB");
  if (mode == 0 || mode == 2) REQUIRE(refused);  // so the check below can fail
  void* range = vm.reserve(bytes);               // address space only: granted
  REQUIRE(range != nullptr);
  const bool committed = vm.commit(range, bytes);
  CHECK(committed == !refused);
  if (committed) vm.decommit(range, bytes);
  vm.release(range, bytes);
}

TEST_CASE("row 9: commit charges its range and decommit gives the charge back (VmFlags)", "[vm][host]") {
  const auto res = make_host_resource();
  virtual_memory& vm = *res->address_space();
  const std::size_t g = vm.granularity();
  auto* base = static_cast<unsigned char*>(vm.reserve(4 * g));
  REQUIRE(base != nullptr);
  CHECK_FALSE(has_flag(vm_flags(base), "ac"));
  REQUIRE(vm.commit(base + g, 2 * g));
  INFO("flags of the committed range:" << vm_flags(base + g));
  CHECK(has_flag(vm_flags(base + g), "ac"));
  CHECK_FALSE(has_flag(vm_flags(base + g), "nr"));
  CHECK_FALSE(has_flag(vm_flags(base), "ac"));  // the rest stays uncharged
  std::memset(base + g, 0x5a, 2 * g);
  vm.decommit(base + g, 2 * g);
  CHECK_FALSE(has_flag(vm_flags(base + g), "ac"));
  REQUIRE(vm.commit(base + g, g));
  CHECK(base[g] == 0);  // fresh pages: the old contents went with the decommit
  vm.decommit(base + g, g);
  vm.release(base, 4 * g);
}

TEST_CASE("row 9: a cache with segments throws out_of_memory for what the kernel refuses", "[vm][host]") {
  const std::size_t bytes = beyond_ram_and_swap();
  if (!plain_allocation_refused(bytes)) {
    WARN("overcommit_memory is 1: the kernel refuses nothing, so there is nothing to check");
    return;
  }
  const backend be = make_host_backend();
  alloc_cache cache{with_segments()};
  CHECK_THROWS_AS(cache.allocate(be, bytes), out_of_memory);
  CHECK(be.outstanding_bytes() == 0);
  const data_ref small = cache.allocate(be, 4 * KiB);  // and it goes on working
  CHECK(small.bytes() == 4 * KiB);
}

// ---- row 6: refused reservations fall back -----------------------------------------------------

TEST_CASE("row 6: a refused reservation falls back to a smaller one, remembered", "[vm][segments]") {
  heap_fixture f;
  segment_heap heap(f.be, vm_options(64 * MiB, 32 * MiB));
  f.failing->arm_only(fault_schedule::reservations, 1, 1);  // only the first reservation is refused
  auto small = heap.carve(4 * KiB, {});
  REQUIRE(small.has_value());
  CHECK(f.failing->injected() == 1);
  CHECK(heap.stats().reserved_bytes == 32 * MiB);
  // The large pool's segment asks for the remembered size at once: one call, not two.
  auto large = heap.carve(8 * MiB, {});
  REQUIRE(large.has_value());
  CHECK(f.failing->calls() == 3);
  CHECK(heap.stats().reserved_bytes == 64 * MiB);
  heap.check();
  heap.give_back(small->p, {});
  heap.give_back(large->p, {});
}

TEST_CASE("row 6: the full reservation is tried again once trim releases a reservation", "[vm][segments]") {
  heap_fixture f;
  segment_heap heap(f.be, vm_options(64 * MiB, 32 * MiB));
  f.failing->arm_only(fault_schedule::reservations, 1, 1);  // the first reservation is refused
  auto small = heap.carve(4 * KiB, {});
  REQUIRE(small.has_value());
  REQUIRE(heap.stats().reserved_bytes == 32 * MiB);
  heap.give_back(small->p, {});
  heap.trim();
  CHECK(heap.stats().reserved_bytes == 0);
  CHECK(f.tracker->reserved() == 0);
  // Address space came back: the next growth asks for the full size again, and gets it.
  f.failing->arm_only(fault_schedule::reservations, 2, 1);  // counts reservations, refuses none here
  auto again = heap.carve(4 * KiB, {});
  REQUIRE(again.has_value());
  CHECK(f.failing->calls() == 1);
  CHECK(heap.stats().reserved_bytes == 64 * MiB);
  heap.check();
  heap.give_back(again->p, {});
  heap.trim();
  // Refused again: halved again, one refused call, then the smaller size.
  f.failing->arm_only(fault_schedule::reservations, 1, 1);
  auto third = heap.carve(4 * KiB, {});
  REQUIRE(third.has_value());
  CHECK(f.failing->calls() == 2);
  CHECK(heap.stats().reserved_bytes == 32 * MiB);
  heap.give_back(third->p, {});
  heap.trim();
  CHECK(f.tracker->reserved() == 0);
}

TEST_CASE("row 6: with every reservation refused, segments are backend allocations", "[vm][segments]") {
  heap_fixture f;
  segment_heap heap(f.be, vm_options(64 * MiB, 32 * MiB));
  f.failing->arm_only(fault_schedule::reservations, 1, UINT64_MAX);
  std::vector<segment_heap::piece> pieces;
  std::uint64_t id = 1;
  for (const std::size_t bytes : {4 * KiB, 3 * MiB, 40 * MiB, 700 * KiB}) {
    CAPTURE(bytes);
    auto c = heap.carve(bytes, {});
    REQUIRE(c.has_value());
    test::stamp(c->p, id++);
    pieces.push_back(c->p);
  }
  heap.check();
  CHECK(f.tracker->reserved() == 0);
  CHECK(f.tracker->allocated() == heap.stats().committed_bytes);
  id = 1;
  for (const auto& p : pieces) {
    CHECK(test::stamped(p, id++));
    heap.give_back(p, {});
  }
  heap.trim(0);
  CHECK(f.tracker->held() == 0);
  CHECK(f.be.outstanding_bytes() == 0);
}

TEST_CASE("row 6: under an address-space limit (ulimit -v) a cache with segments still allocates", "[vm][segments]") {
  if (sanitized) {
    WARN("not under a sanitizer: its shadow memory does not fit an address-space limit");
    return;
  }
  const auto [aborted, output] = refpool::test::in_child([] {
    rlimit limit{};
    getrlimit(RLIMIT_AS, &limit);
    limit.rlim_cur = status_bytes("VmSize") + GiB;  // no room for 256 GiB of address space
    if (setrlimit(RLIMIT_AS, &limit) != 0) std::fprintf(stderr, "setrlimit failed\n");
    const backend be = make_host_backend();
    alloc_cache cache{with_segments()};
    try {
      const data_ref small = cache.allocate(be, 4 * KiB);
      const data_ref large = cache.allocate(be, 64 * MiB);
      std::memset(small.data(), 1, small.bytes());
      std::memset(large.data(), 2, large.bytes());
      std::fprintf(stderr, "allocated in %zu segments\n", cache.stats().segments);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "threw: %s\n", e.what());
    }
  });
  INFO(output);
  CHECK_FALSE(aborted);
  CHECK_THAT(output, Catch::Contains("allocated in 2 segments"));
}

// ---- row 8: plan arenas -------------------------------------------------------------------------
// An arena is a span of its backend's segment heap; in a cache without segments that heap gives
// each span a segment of its own: one backend allocation, made at the arena's first claim.

namespace {

// Four runs of a planned step of 40 MiB: the first is pending, the second recorded (a plan, its
// arena not placed yet); the third's first request places the arena's span (the backend's second
// allocation: the first run's block is reused by the second, and freed just before the span is
// made). If that fails, the third run is served by the plain cache and the fourth places it.
void planned_runs(alloc_cache& cache, const backend& be) {
  for (int i = 0; i < 4; ++i) {
    scope s(cache, {.plan = "step"});
    auto a = allocate(be, 40 * MiB);
    std::memset(a.data(), i, a.bytes());
  }
}

}  // namespace

TEST_CASE("row 8: an arena whose span's allocation throws holds nothing, and the cache closes cleanly", "[vm][plan]") {
  const auto [aborted, output] = refpool::test::in_child([] {
    auto failing = std::make_shared<failing_resource>(make_host_resource());
    const backend be(failing);
    {
      alloc_cache cache{cache_options{}};
      failing->arm_only(fault_schedule::allocations, 2, 1, how::backend_error);
      planned_runs(cache, be);
      const cache_stats st = cache.stats();
      std::fprintf(stderr, "%llu allocation failed; %zu plan; %llu hits\n",
                   static_cast<unsigned long long>(failing->injected()), static_cast<std::size_t>(st.plans),
                   static_cast<unsigned long long>(st.plan_hits));
    }
    std::fprintf(stderr, "closed with %zu B out\n", be.outstanding_bytes());
  });
  INFO(output);
  CHECK_FALSE(aborted);
  CHECK_THAT(output, Catch::Contains("1 allocation failed; 1 plan; 1 hits"));  // the fourth run replays
  CHECK_THAT(output, Catch::Contains("closed with 0 B out"));
}

TEST_CASE("plan arenas: a span's allocation that fails either way costs one replay, never a leak", "[vm][plan]") {
  for (const how h : {how::out_of_memory, how::backend_error}) {
    CAPTURE(static_cast<int>(h));
    auto failing = std::make_shared<failing_resource>(make_host_resource());
    const backend be(failing);
    {
      alloc_cache cache{cache_options{}};
      failing->arm_only(fault_schedule::allocations, 2, h == how::out_of_memory ? 2 : 1, h);
      planned_runs(cache, be);
      CHECK(failing->injected() == (h == how::out_of_memory ? 2 : 1));
      // Out of memory: the ladder's retry fails too (two refused). Either way the third run is
      // served by the plain cache and the fourth places the span and replays.
      const cache_stats st = cache.stats();
      CHECK(st.plans == 1);
      CHECK(st.plan_hits == 1);
      CHECK(st.arena_bytes == 40 * MiB);
      CHECK(be.outstanding_bytes() == st.reserved_bytes);
    }
    CHECK(be.outstanding_bytes() == 0);
  }
}

// ---- vm_region: the one place ------------------------------------------------------------------

namespace {

// Host virtual memory whose reservations start a page past a granule boundary.
class misaligned_vm final : public virtual_memory {
 public:
  explicit misaligned_vm(virtual_memory& upstream) : upstream_(upstream) {}
  std::size_t granularity() const noexcept override { return upstream_.granularity(); }
  void* reserve(std::size_t bytes) override {
    raw_ = upstream_.reserve(bytes + granularity());
    return static_cast<char*>(raw_) + 4096;
  }
  bool commit(void* addr, std::size_t bytes) override { return upstream_.commit(addr, bytes); }
  void decommit(void* addr, std::size_t bytes) noexcept override { upstream_.decommit(addr, bytes); }
  void release(void*, std::size_t bytes) noexcept override {
    upstream_.release(raw_, bytes + granularity());
    ++releases;
  }
  int releases = 0;

 private:
  virtual_memory& upstream_;
  void* raw_ = nullptr;
};

}  // namespace

TEST_CASE("vm_region: each call's failure rule", "[vm]") {
  heap_fixture f;
  detail::backend_state& state = *detail::access::state(f.be);
  virtual_memory& vm = *f.be.underlying().address_space();
  const std::size_t g = vm.granularity();

  SECTION("a refused reservation is an empty region; one that throws holds nothing") {
    f.failing->arm_only(fault_schedule::reservations, 1, 1, how::out_of_memory);
    CHECK_FALSE(vm_region::reserve(state, vm, 4 * g));
    f.failing->arm_only(fault_schedule::reservations, 1, 1, how::backend_error);
    CHECK_THROWS_AS(vm_region::reserve(state, vm, 4 * g), backend_error);
    CHECK(f.tracker->reservations() == 0);
  }
  SECTION("a reservation off the granule grid is released and reported") {
    misaligned_vm off(vm);
    CHECK_THROWS_AS(vm_region::reserve(state, off, 4 * g), backend_error);
    CHECK(off.releases == 1);
    CHECK(f.tracker->reservations() == 0);
  }
  SECTION("a refused or throwing commit leaves the region as it was") {
    vm_region r = vm_region::reserve(state, vm, 4 * g);
    REQUIRE(r);
    f.failing->arm_only(fault_schedule::commits, 1, 1, how::out_of_memory);
    CHECK_FALSE(r.commit(0, g));
    f.failing->arm_only(fault_schedule::commits, 1, 1, how::backend_error);
    CHECK_THROWS_AS(r.commit(0, g), backend_error);
    CHECK(r.committed() == 0);
    CHECK(r.commits().empty());
    CHECK(f.be.outstanding_bytes() == 0);
    // A bug in the caller is no backend failure.
    CHECK_THROWS_AS(r.commit(4096, g), std::logic_error);
    CHECK_THROWS_AS(r.commit(3 * g, 2 * g), std::logic_error);
    REQUIRE(r.commit(0, 2 * g));
    CHECK_THROWS_AS(r.commit(g, g), std::logic_error);
  }
  SECTION("commits with holes are counted, decommitted whole, and all go with the region") {
    {
      vm_region r = vm_region::reserve(state, vm, 8 * g);
      REQUIRE(r);
      REQUIRE(r.commit(4 * g, 2 * g));
      REQUIRE(r.commit(0, g));
      CHECK(r.commits().size() == 2);
      CHECK(r.commits()[0].offset == 0);
      CHECK(r.first_ending_after(g) == 1);
      CHECK(f.be.outstanding_bytes() == 3 * g);
      CHECK(f.tracker->committed() == 3 * g);
      r.decommit(1);
      CHECK(f.be.outstanding_bytes() == g);
      CHECK(f.tracker->decommits() == 1);
    }
    CHECK(f.tracker->decommits() == 2);
    CHECK(f.tracker->held() == 0);
    CHECK(f.tracker->reserved() == 0);
    CHECK(f.be.outstanding_bytes() == 0);
    // Released with nothing committed: no decommit at all (an arena's first commit failed).
    vm_region().free_reservation();
    { vm_region empty = vm_region::reserve(state, vm, 2 * g); }
    CHECK(f.tracker->decommits() == 2);
    CHECK(f.tracker->bad_releases() == 0);
  }
}

TEST_CASE("host decommit refused by the kernel (the map count limit): the pages still go, nothing aborts",
          "[vm][host]") {
  if (sanitized) {
    WARN("not under a sanitizer: its allocator needs new mappings, which the test uses up");
    return;
  }
  const auto [aborted, output] = refpool::test::in_child([] {
    const auto res = make_host_resource();
    virtual_memory& vm = *res->address_space();
    const std::size_t g = vm.granularity();
    auto* base = static_cast<unsigned char*>(vm.reserve(3 * g));
    if (base == nullptr || !vm.commit(base, 3 * g)) return;  // one mapping of three granules
    std::memset(base, 0x5a, 3 * g);
    // Use up the map count: small mappings that cannot merge (their protections alternate).
    for (int i = 0;; ++i)
      if (mmap(nullptr, 4096, i % 2 != 0 ? PROT_READ : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
        break;
    // Decommitting the middle granule splits the mapping in three: the kernel refuses.
    vm.decommit(base + g, g);
    std::fprintf(stderr, "decommitted: %d %d %d\n", base[0], base[g], base[3 * g - 1]);
    vm.release(base, 3 * g);  // the whole mapping: no split
    std::fprintf(stderr, "released\n");
  });
  INFO(output);
  CHECK_FALSE(aborted);
  CHECK_THAT(output, Catch::Contains("decommitted: 90 0 90"));  // the middle's pages went, the rest stayed
  CHECK_THAT(output, Catch::Contains("released"));
}

TEST_CASE("host decommit or release of a range off the granule grid aborts, naming the call", "[vm][host]") {
  const auto res = make_host_resource();
  virtual_memory& vm = *res->address_space();
  for (const bool decommit : {true, false}) {
    const auto [aborted, output] = refpool::test::in_child([&] {
      if (decommit)
        vm.decommit(reinterpret_cast<void*>(4096), 4096);
      else
        vm.release(reinterpret_cast<void*>(4096), 4096);
    });
    CHECK(aborted);
    CHECK_THAT(output, Catch::Contains(decommit ? "decommit(" : "release("));
  }
}
