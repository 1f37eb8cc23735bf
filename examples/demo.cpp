// refpool-demo: a loop whose body allocates arrays of changing shapes (the same byte sizes)
// inside a cache scope, on the GPU when one is usable, else on the host. From the second
// iteration on every request is a hit and no memory is allocated from the backend. A bad
// REFPOOL_CONF (or REFPOOL_NO_CACHING) is reported with what to fix, and exit status 2.
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include <refpool/refpool.hpp>
#include <refpool/stats_format.hpp>

namespace {

struct device_context {
  refpool::backend be;
  refpool::stream_ref stream;
  bool gpu = false;
};

void fill(const device_context& ctx, void* p, unsigned char value, std::size_t bytes) {
  if (ctx.gpu) {
    refpool::cuda::fill(p, value, bytes, ctx.stream);
  } else {
    std::memset(p, value, bytes);
  }
}

// One "training step": temporaries of equal byte sizes in rotating shapes and element types.
void step(const device_context& ctx) {
  using refpool::empty;
  auto a = empty<float>(ctx.be, {16}, ctx.stream);  // 64 B
  fill(ctx, a.data(), 1, a.bytes());
  a.unsafe_free();                                          // released early: reusable at once
  auto b = empty<float>(ctx.be, {4, 4}, ctx.stream);        // 64 B, a's buffer as 4x4
  auto c = empty<double>(ctx.be, {8}, ctx.stream);          // 64 B, another element type
  auto m = empty<float>(ctx.be, {1024, 1024}, ctx.stream);  // 4 MiB
  fill(ctx, m.data(), 0, m.bytes());
  auto flat = m.reshape({1048576});  // same buffer, another shape
  m = {};
  auto wide = empty<float>(ctx.be, {512, 2048}, ctx.stream);  // 4 MiB while flat is live
  fill(ctx, wide.data(), 2, wide.bytes());
  fill(ctx, b.data(), 3, b.bytes());
  fill(ctx, c.data(), 4, c.bytes());
}

int run() {
  device_context ctx{refpool::host_backend(), {}, false};
  std::unique_ptr<refpool::cuda::stream> stream;
  if (refpool::cuda::available()) {
    stream = std::make_unique<refpool::cuda::stream>(0);
    ctx = {refpool::cuda::device(0), stream->ref(), true};
    fmt::print("running on {} (CUDA driver {})\n", refpool::cuda::device_name(0), refpool::cuda::driver_version());
  } else {
    fmt::print("running on the host backend ({})\n", refpool::cuda::unavailable_reason());
  }
  refpool::alloc_cache cache;
  constexpr int iterations = 10;
  for (int i = 0; i < iterations; ++i) {
    const auto before = cache.stats();
    const auto allocations_before = ctx.be.allocation_count();
    refpool::cached(cache, [&] { step(ctx); });
    const auto after = cache.stats();
    fmt::print("iteration {:2}: {} hits, {} misses, {} backend allocations\n", i, after.hits - before.hits,
               after.misses - before.misses, ctx.be.allocation_count() - allocations_before);
  }
  if (ctx.gpu) refpool::cuda::synchronize(ctx.stream);
  fmt::print("\nbackend {}:\n{}", ctx.be.name(), cache.summary());
  return 0;
}

// The environment's configuration is read at the first cache; its errors name the key and the
// values allowed, so the demo says so and which variables to look at, instead of aborting.
void explain(const refpool::config_error& e) {
  const char* conf = std::getenv("REFPOOL_CONF");
  const char* no_caching = std::getenv("REFPOOL_NO_CACHING");
  fmt::print(stderr, "refpool-demo: refpool's configuration has an error:\n  {}\n", e.what());
  if (conf != nullptr) fmt::print(stderr, "REFPOOL_CONF is '{}'.\n", conf);
  if (no_caching != nullptr) fmt::print(stderr, "REFPOOL_NO_CACHING is '{}'.\n", no_caching);
  fmt::print(stderr,
             "Fix the value named above (or unset the variable) and run again; docs/design.md, "
             "\"Configuration\", lists every key.\n");
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const refpool::config_error& e) {
    explain(e);
    return 2;
  }
}
