// Configure calls that fail change nothing (issue 23 row 5). A cache the C API refuses to make
// (a bad rounding mode or parameter, bad segments) is not made: the cache it was to replace serves
// on, and no backend call or counter moves (check_all). The framework allocator, process-wide, is
// configured once per process (host runtime, step:512 rounding) before its first use; rejected
// configures around it, whose valid fields differ (another runtime, another rounding), must leave
// it as it was: its buffers come from the host, rounded to 512 B.
#include <refpool/pointer.hpp>
#include <refpool/refpool.h>

#include "session.hpp"

namespace refpool::test::fuzz {

namespace {

constexpr std::size_t framework_step = 512;
bool framework_in_use = false;  // its first allocation was made in this process

/// C options refpool_cache_create and refpool_allocator_configure reject, and the field to blame.
struct rejected_options {
  refpool_cache_options options;
  const char* names;  ///< what the error message must mention
};

rejected_options bad_cache_options(std::size_t which) {
  refpool_cache_options o;
  refpool_cache_options_init(&o, sizeof o);
  switch (which % 5) {
    case 0: o.rounding.mode = static_cast<refpool_rounding>(7); return {o, "rounding"};
    case 1: o.rounding = {REFPOOL_ROUNDING_STEP, 0}; return {o, "step"};
    case 2: o.rounding = {REFPOOL_ROUNDING_POW2, 3}; return {o, "power of two"};
    case 3: o.rounding = {REFPOOL_ROUNDING_POW2, std::size_t{1} << 40}; return {o, "power of two"};
    default: o.segments = static_cast<refpool_segment_policy>(5); return {o, "segments"};
  }
}

}  // namespace

void session::op_failing_configure(int t) {
  const int c = in_.byte() & 1;
  const std::size_t which = in_.below(5);
  const bool framework = in_.below(2) == 0;
  const rejected_options bad = bad_cache_options(which);
  if (!framework) {
    trace("thread {}: replace cache {} by one from C options the C API rejects ({})", t, c, bad.names);
    refpool_cache made{0};  // C handles carry ids; 0 is none
    refpool_status status = REFPOOL_OK;
    std::string error;
    expect(on(t,
              [&] {
                status = refpool_cache_create(&bad.options, sizeof bad.options, &made);
                error = refpool_last_error();
              }),
           outcome::ok, "refpool_cache_create");
    if (status != REFPOOL_ERROR_CONFIG || made.id != 0 || error.find(bad.names) == std::string::npos)
      fail(
          fmt::format("refpool_cache_create with bad {}: status {}, cache id {}, error \"{}\"; the model expected "
                      "REFPOOL_ERROR_CONFIG naming it, and no cache",
                      bad.names, static_cast<int>(status), made.id, error));
    all.configure_failures += 1;
    return;
  }
  // Rejected for one field each; the valid fields differ from the configuration in use.
  refpool_allocator_options rejected;
  refpool_allocator_options_init(&rejected, sizeof rejected);
  const std::size_t runtime_pick = in_.below(4);
  const char* names = bad.names;
  refpool_cache_options rejected_cache = bad.options;
  if (runtime_pick == 1) {
    rejected.runtime = static_cast<refpool_runtime>(9);
    refpool_cache_options_init(&rejected_cache, sizeof rejected_cache);
    names = "runtime";
  } else if (runtime_pick == 2) {
    rejected.runtime = REFPOOL_RUNTIME_CUDA;
    rejected.kind = REFPOOL_MEMORY_PINNED_HOST;
    refpool_cache_options_init(&rejected_cache, sizeof rejected_cache);
    names = "kind";
  } else {
    rejected.runtime = runtime_pick == 0 ? REFPOOL_RUNTIME_CUDA : REFPOOL_RUNTIME_HIP;
  }
  if (framework_in_use) names = "already in use";
  trace("thread {}: refpool_allocator_configure with a bad {}, then a framework allocation", t, names);
  refpool_status configured = REFPOOL_OK, rejected_status = REFPOOL_OK, allocated = REFPOOL_OK, freed = REFPOOL_OK;
  std::string error;
  void* p = nullptr;
  std::size_t capacity = 0;
  rp::memory_kind kind = rp::memory_kind::device;
  const std::size_t bytes = 1 + in_.below(framework_step);
  const bool first = !framework_in_use;
  expect(on(t,
            [&] {
              if (first) {  // before the first use: the configuration the rejected calls must keep
                refpool_allocator_options good;
                refpool_allocator_options_init(&good, sizeof good);
                good.runtime = REFPOOL_RUNTIME_HOST;
                refpool_cache_options good_cache;
                refpool_cache_options_init(&good_cache, sizeof good_cache);
                good_cache.rounding = {REFPOOL_ROUNDING_STEP, framework_step};
                configured = refpool_allocator_configure(&good, sizeof good, &good_cache, sizeof good_cache);
              }
              rejected_status =
                  refpool_allocator_configure(&rejected, sizeof rejected, &rejected_cache, sizeof rejected_cache);
              error = refpool_last_error();
              allocated = refpool_allocator_alloc(bytes, 0, nullptr, &p);
              if (allocated != REFPOOL_OK) return;
              const rp::data_ref ref = rp::pointer_ref(p);
              capacity = ref.capacity();
              kind = ref.source().kind();
              freed = refpool_free(p);
            }),
         outcome::ok, "the framework allocator's C calls");
  framework_in_use = true;
  if (configured != REFPOOL_OK) fail(fmt::format("refpool_allocator_configure of a host runtime failed: {}", error));
  if (rejected_status != REFPOOL_ERROR_CONFIG || error.find(names) == std::string::npos)
    fail(
        fmt::format("refpool_allocator_configure with a bad {}: status {}, error \"{}\"; the model expected "
                    "REFPOOL_ERROR_CONFIG naming it",
                    names, static_cast<int>(rejected_status), error));
  if (allocated != REFPOOL_OK || kind != rp::memory_kind::host || capacity != framework_step || freed != REFPOOL_OK)
    fail(fmt::format(
        "after a rejected refpool_allocator_configure, a framework allocation of {} B gave status {} "
        "(free: {}), memory kind {}, capacity {} B; the model expected host memory rounded to {} B: the "
        "rejected call changed the configuration",
        bytes, static_cast<int>(allocated), static_cast<int>(freed), static_cast<int>(kind), capacity, framework_step));
  all.configure_failures += 1;
}

}  // namespace refpool::test::fuzz
