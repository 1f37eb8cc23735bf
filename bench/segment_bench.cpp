// The segment heap (lib/segments/) on the host backend, alone and behind refpool's cache, side
// by side with the allocators it replaces: RMM's random_allocations pattern (sizes uniform in [1, max], 73% allocations
// while under a live cap, random free order) and the captured training-step traces, reporting peak memory held against
// peak live bytes, ns per operation and backend calls. Compared with: idle blocks kept per exact size (refpool's cache
// without splitting), the same with pow2:4 keys, and malloc/free. `--sweep` adds the size-class measurements
// docs/segments.md cites. Usage: segment_bench [--json FILE] [--ops N] [--cap BYTES] [--sweep] [--only TEXT]
// [TRACE.csv...]
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <refpool/refpool.hpp>

#include "segments/segment_heap.hpp"
#include "timing.hpp"
#include "trace_file.hpp"

namespace {

using refpool::detail::segment_heap;
using refpool::detail::segment_heap_options;
using clock_type = std::chrono::steady_clock;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

/// What every allocator reports: bytes it holds from its backend, and calls that obtained memory.
struct footprint {
  std::size_t held = 0;
  std::uint64_t backend_calls = 0;
};

// The segment heap, with the cache's out-of-memory step (give free memory back, retry once).
class heap_allocator {
 public:
  using handle = segment_heap::piece;
  heap_allocator(segment_heap_options options, std::string label)
      : heap_(refpool::make_host_backend(), options), label_(std::move(label)) {}
  handle allocate(std::size_t bytes) {
    auto c = heap_.carve(bytes, {});
    if (!c) {
      heap_.trim(0);
      c = heap_.carve(bytes, {});
    }
    if (!c) throw refpool::out_of_memory("segment bench: out of memory", bytes, -1);
    return c->p;
  }
  void deallocate(handle& h) { heap_.give_back(h, refpool::stream_ref{}); }
  footprint measure() const {
    const auto st = heap_.stats();
    return {st.committed_bytes, st.events.segments_made + st.events.grows};
  }
  const std::string& label() const { return label_; }

 private:
  segment_heap heap_;
  std::string label_;
};

// Idle blocks kept per key and reused only by a request of the same key: refpool's cache as it
// is without segments. On "out of memory" (held past `capacity`, standing in for the device) it
// frees every idle block and retries, as the cache does.
class idle_blocks {
 public:
  struct handle {
    void* ptr;
    std::size_t key;
  };
  idle_blocks(refpool::rounding_policy rounding, std::size_t capacity, std::string label)
      : rounding_(rounding), capacity_(capacity), label_(std::move(label)) {}
  ~idle_blocks() { free_idle(); }
  handle allocate(std::size_t bytes) {
    const std::size_t key = rounding_.round(bytes);
    if (auto it = idle_.find(key); it != idle_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return {p, key};
    }
    if (held_ + key > capacity_) free_idle();
    void* p = res_->allocate(key, {});
    if (p == nullptr) throw refpool::out_of_memory("segment bench: out of memory", key, -1);
    held_ += key;
    ++calls_;
    return {p, key};
  }
  void deallocate(handle& h) { idle_[h.key].push_back(h.ptr); }
  footprint measure() const { return {held_, calls_}; }
  const std::string& label() const { return label_; }

 private:
  void free_idle() {
    for (auto& [key, list] : idle_) {
      for (void* p : list) res_->deallocate(p, key, {});
      held_ -= key * list.size();
      list.clear();
    }
  }
  std::shared_ptr<refpool::resource> res_ = refpool::make_host_resource();
  refpool::rounding_policy rounding_;
  std::size_t capacity_;
  std::size_t held_ = 0;
  std::uint64_t calls_ = 0;
  std::unordered_map<std::size_t, std::vector<void*>> idle_;
  std::string label_;
};

// refpool's cache itself (one scope for the run) on the host backend, with or without segments:
// what a user gets. Held is everything the backend has out (blocks, segments, free bytes in
// them); calls are block allocations plus segment growth. Behind a limit standing in for the
// device, as for idle_blocks, so that out of memory reclaims as it would on a GPU.
class cache_allocator {
 public:
  using handle = refpool::data_ref;
  cache_allocator(refpool::cache_options options, std::size_t capacity, std::string label)
      : be_(std::make_shared<refpool::limiting_resource>(refpool::make_host_resource(), capacity)),
        cache_(std::make_unique<refpool::alloc_cache>(options)),
        scope_(std::make_unique<refpool::scope>(*cache_)),
        label_(std::move(label)) {}
  ~cache_allocator() {
    scope_.reset();
    cache_.reset();
  }
  handle allocate(std::size_t bytes) { return refpool::allocate(be_, bytes); }
  void deallocate(handle& h) { h.reset(); }
  footprint measure() const {
    return {be_.outstanding_bytes(), be_.allocation_count() + cache_->stats().segment_grows};
  }
  const std::string& label() const { return label_; }

 private:
  refpool::backend be_;
  std::unique_ptr<refpool::alloc_cache> cache_;
  std::unique_ptr<refpool::scope> scope_;
  std::string label_;
};

// malloc/free; held is what glibc holds from the kernel (heap arena + mmapped chunks).
class malloc_allocator {
 public:
  using handle = void*;
  malloc_allocator() : base_(glibc_held()) {}
  handle allocate(std::size_t bytes) {
    void* p = std::malloc(bytes);
    if (p == nullptr) throw refpool::out_of_memory("segment bench: malloc failed", bytes, -1);
    return p;
  }
  void deallocate(handle& p) { std::free(p); }
  footprint measure() const {
    const std::size_t now = glibc_held();
    return {now > base_ ? now - base_ : 0, 0};
  }
  const std::string& label() const { return label_; }

 private:
  static std::size_t glibc_held() {
    const struct mallinfo2 m = ::mallinfo2();
    return m.arena + m.hblkhd;
  }
  std::size_t base_;
  std::string label_ = "malloc/free";
};

struct outcome {
  double ns_per_op = 0;
  std::size_t peak_live = 0;
  std::size_t peak_held = 0;
  std::uint64_t backend_calls = 0;
  [[nodiscard]] double ratio() const { return peak_live == 0 ? 0 : static_cast<double>(peak_held) / peak_live; }
};

// RMM's random_allocations, as bench/gpu/workloads.hpp runs it on the GPU. With `measure`,
// the allocator's footprint is sampled after every operation (not timed). `small_share` > 0
// draws that share of the sizes from [1, 64 KiB] instead (a mix of small and large requests).
template <class A>
outcome random_allocations(A& a, std::size_t max_bytes, int ops, std::size_t live_cap, bool measure, unsigned seed = 1,
                           double small_share = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> large_size(1, max_bytes);
  std::uniform_int_distribution<std::size_t> small_size(1, std::size_t{64} << 10);
  std::bernoulli_distribution is_small(small_share);
  const auto size = [&](std::mt19937_64& r) { return small_share > 0 && is_small(r) ? small_size(r) : large_size(r); };
  std::bernoulli_distribution allocate_now(0.73);
  std::vector<std::pair<typename A::handle, std::size_t>> live;
  outcome out;
  std::size_t live_bytes = 0;
  const auto start = clock_type::now();
  for (int op = 0; op < ops; ++op) {
    if (live.empty() || (allocate_now(rng) && live_bytes < live_cap)) {
      const std::size_t bytes = size(rng);
      live.emplace_back(a.allocate(bytes), bytes);
      live_bytes += bytes;
      out.peak_live = std::max(out.peak_live, live_bytes);
    } else {
      const std::size_t i = rng() % live.size();
      live_bytes -= live[i].second;
      a.deallocate(live[i].first);
      live[i] = std::move(live.back());
      live.pop_back();
    }
    if (measure) out.peak_held = std::max(out.peak_held, a.measure().held);
  }
  out.ns_per_op = std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / ops;
  for (auto& [h, bytes] : live) a.deallocate(h);
  out.backend_calls = a.measure().backend_calls;
  return out;
}

// Measures malloc's footprint in a new process (this program run again with --malloc-measure):
// glibc's heap only grows in a process whose heap no earlier run has shaped.
outcome malloc_in_new_process(std::size_t max_bytes, int ops, std::size_t cap) {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw std::runtime_error("cannot find /proc/self/exe");
  const std::string command = fmt::format("'{}' --malloc-measure {} {} {}", self, max_bytes, ops, cap);
  std::FILE* child = ::popen(command.c_str(), "r");
  if (child == nullptr) throw std::runtime_error("cannot run " + command);
  outcome o;
  unsigned long long live = 0, held = 0;
  const int fields = std::fscanf(child, "%llu %llu", &live, &held);
  if (::pclose(child) != 0 || fields != 2) throw std::runtime_error("measuring child failed: " + command);
  o.peak_live = live;
  o.peak_held = held;
  return o;
}

// Runs a workload on fresh allocators: once measuring the footprint, then `repeats` times timed;
// the median time.
template <class Make, class Workload>
outcome run(Make make, Workload workload, int repeats, std::optional<outcome> measured_elsewhere = std::nullopt) {
  outcome measured;
  if (measured_elsewhere) {
    measured = *measured_elsewhere;
  } else {
    auto a = make();
    measured = workload(*a, true);
  }
  std::vector<double> ns;
  for (int r = 0; r < repeats; ++r) {
    auto a = make();
    ns.push_back(workload(*a, false).ns_per_op);
  }
  std::nth_element(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(ns.size() / 2), ns.end());
  measured.ns_per_op = ns[ns.size() / 2];
  return measured;
}

// --- traces (bench/traces/*.csv.xz: step,event,index,bytes) ---

using event = refpool::bench::trace_event;
using step = refpool::bench::trace_step;
using refpool::bench::read_trace;

// Replays the steps in turn, `iterations` times; what a step leaves live is freed at its end.
// backend_calls counts only the calls after every step was seen twice (steady state).
template <class A>
outcome replay(A& a, const std::vector<step>& steps, int iterations, bool measure) {
  outcome out;
  std::vector<std::optional<typename A::handle>> live;
  std::uint64_t calls_at_steady = 0;
  const int warmup = static_cast<int>(2 * steps.size());
  std::size_t requests = 0;
  double ns = 0;
  for (int it = 0; it < iterations; ++it) {
    if (it == warmup) calls_at_steady = a.measure().backend_calls;
    const step& st = steps[static_cast<std::size_t>(it) % steps.size()];
    std::size_t live_bytes = 0;
    std::vector<std::size_t> size_of;
    const auto start = clock_type::now();
    for (const event& e : st) {
      if (live.size() <= e.index) live.resize(e.index + 1);
      if (size_of.size() <= e.index) size_of.resize(e.index + 1);
      if (e.alloc) {
        live[e.index] = a.allocate(e.bytes);
        size_of[e.index] = e.bytes;
        live_bytes += e.bytes;
        out.peak_live = std::max(out.peak_live, live_bytes);
      } else if (live[e.index]) {
        a.deallocate(*live[e.index]);
        live[e.index].reset();
        live_bytes -= size_of[e.index];
      }
      if (measure) out.peak_held = std::max(out.peak_held, a.measure().held);
    }
    for (auto& h : live)
      if (h) {
        a.deallocate(*h);
        h.reset();
      }
    if (it >= warmup) {
      ns += std::chrono::duration<double, std::nano>(clock_type::now() - start).count();
      requests += st.size();
    }
  }
  out.ns_per_op = ns / static_cast<double>(std::max<std::size_t>(requests, 1));
  out.backend_calls = a.measure().backend_calls - calls_at_steady;
  return out;
}

segment_heap_options vm_defaults() { return {}; }
segment_heap_options plain_defaults() {
  segment_heap_options o;
  o.use_virtual_memory = false;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "segment_bench.json";
  int ops = 20000;            // as on the H200 (docs/benchmarks.md §4)
  std::size_t cap = 8 * GiB;  // the H200 run's live cap
  bool sweep = false;
  std::string only;  // rows whose label contains this, e.g. "cache"
  std::vector<std::string> traces;
  std::vector<std::size_t> malloc_measure;  // the child of malloc_in_new_process: MAX OPS CAP
  CLI::App app{"The segment heap against idle blocks and malloc: speed and held/live"};
  app.add_option("--json", json_path, "Write the rows to this file")->capture_default_str();
  app.add_option("--ops", ops, "Operations of each random run")->capture_default_str();
  app.add_option("--cap", cap, "Live bytes at most in the random runs")->capture_default_str();
  app.add_flag("--sweep", sweep, "Also held/live under each change of one heap option");
  app.add_option("--only", only, "Only the rows whose label contains this");
  app.add_option("--malloc-measure", malloc_measure)->expected(3)->group("");  // internal: one malloc run
  app.add_option("trace", traces, "Trace files (bench/traces/*.csv.xz)")->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);
  if (!malloc_measure.empty()) {
    malloc_allocator a;
    const outcome o =
        random_allocations(a, malloc_measure[0], static_cast<int>(malloc_measure[1]), malloc_measure[2], true);
    fmt::print("{} {}\n", o.peak_live, o.peak_held);
    return 0;
  }
  // The idle-block caches "run out of memory" at 16x the live cap: about where the H200
  // (141 GB) stopped refpool's exact-key cache in the 8 GiB run.
  const std::size_t device = 16 * cap;
  const int repeats = 5;
  refpool::bench::json_rows json;

  const auto make_heap = [](segment_heap_options o, const char* label) {
    return [o, label] { return std::make_unique<heap_allocator>(o, label); };
  };
  const auto make_idle = [device](refpool::rounding_policy r, const char* label) {
    return [r, device, label] { return std::make_unique<idle_blocks>(r, device, label); };
  };
  const auto make_cache = [device](refpool::segment_policy segments, refpool::rounding_policy r, const char* label) {
    refpool::cache_options o;
    o.segments = segments;
    o.rounding = r;
    return [o, device, label] { return std::make_unique<cache_allocator>(o, device, label); };
  };

  fmt::print(
      "random allocations (RMM pattern): sizes uniform in [1, max], 73% allocations while under a {} GiB live "
      "cap, {} operations, random free order; held/live = peak held / peak live; median of {} timed runs\n",
      cap / GiB, ops, repeats);
  fmt::print("{:<28} | {:>9} {:>9} {:>8} | {:>9} {:>9} {:>8}\n", "allocator", "1M ns/op", "held/live", "calls",
             "64M ns/op", "held/live", "calls");
  const auto row = [&](const std::string& label, auto make, bool new_process = false) {
    if (!only.empty() && label.find(only) == std::string::npos) return;
    std::string line = fmt::format("{:<28} |", label);
    for (std::size_t max : {1 * MiB, 64 * MiB}) {
      std::optional<outcome> elsewhere;
      if (new_process) elsewhere = malloc_in_new_process(max, ops, cap);
      const outcome o = run(
          make, [&](auto& a, bool m) { return random_allocations(a, max, ops, cap, m); }, repeats, elsewhere);
      line += fmt::format(" {:>9.0f} {:>8.3f}x {:>8} |", o.ns_per_op, o.ratio(), o.backend_calls);
      json.add({{"workload", "random"},
                {"max_bytes", max},
                {"ops", ops},
                {"live_cap", cap},
                {"allocator", label},
                {"ns_per_op", o.ns_per_op},
                {"peak_live_bytes", o.peak_live},
                {"peak_held_bytes", o.peak_held},
                {"held_over_live", o.ratio()},
                {"backend_calls", o.backend_calls}});
    }
    line.pop_back();
    fmt::print("{}\n", line);
  };
  row("segment heap, virtual mem.", make_heap(vm_defaults(), "heap vm"));
  row("segment heap, allocations", make_heap(plain_defaults(), "heap plain"));
  row("idle blocks, exact keys", make_idle(refpool::rounding_policy::exact(), "exact"));
  row("idle blocks, pow2:4 keys", make_idle(refpool::rounding_policy::pow2(4), "pow2:4"));
  row("cache, segments on", make_cache(refpool::segment_policy::on, refpool::rounding_policy::exact(), "cache on"));
  row("cache, segments off", make_cache(refpool::segment_policy::off, refpool::rounding_policy::exact(), "cache off"));
  row("cache, off, pow2:4 keys",
      make_cache(refpool::segment_policy::off, refpool::rounding_policy::pow2(4), "cache off pow2:4"));
  row(
      "malloc/free", [] { return std::make_unique<malloc_allocator>(); }, true);

  if (!traces.empty()) {
    const int iterations = 30;
    fmt::print(
        "\ntraces (bench/traces), {} steps replayed in turn; held/live = peak held / peak live; steady calls = "
        "backend calls after every step was seen twice\n",
        iterations);
    fmt::print("{:<16} {:<28} | {:>9} {:>9} {:>12}\n", "trace", "allocator", "ns/req", "held/live", "steady calls");
    for (const std::string& path : traces) {
      const auto steps = read_trace(path);
      const std::string name = refpool::bench::trace_name(path);
      const auto trace_row = [&](const std::string& label, auto make) {
        if (!only.empty() && label.find(only) == std::string::npos) return;
        const outcome o = run(
            make, [&](auto& a, bool m) { return replay(a, steps, iterations, m); }, repeats);
        fmt::print("{:<16} {:<28} | {:>9.0f} {:>8.3f}x {:>12}\n", name, label, o.ns_per_op, o.ratio(), o.backend_calls);
        json.add({{"workload", "trace"},
                  {"trace", name},
                  {"allocator", label},
                  {"ns_per_request", o.ns_per_op},
                  {"peak_live_bytes", o.peak_live},
                  {"peak_held_bytes", o.peak_held},
                  {"held_over_live", o.ratio()},
                  {"steady_backend_calls", o.backend_calls}});
      };
      trace_row("segment heap, virtual mem.", make_heap(vm_defaults(), "heap vm"));
      trace_row("segment heap, allocations", make_heap(plain_defaults(), "heap plain"));
      trace_row("idle blocks, exact keys", make_idle(refpool::rounding_policy::exact(), "exact"));
      trace_row("idle blocks, pow2:4 keys", make_idle(refpool::rounding_policy::pow2(4), "pow2:4"));
      trace_row("cache, segments on", make_cache(refpool::segment_policy::on, refpool::rounding_policy::exact(), "on"));
      trace_row("cache, segments off",
                make_cache(refpool::segment_policy::off, refpool::rounding_policy::exact(), "off"));
    }
  }

  if (sweep) {
    // Mean held/live over seeds 1..5 for the random workloads ("mixed": half the requests of
    // at most 64 KiB, half up to 64 MiB), and the traces, under each change of one option.
    const int seeds = 5;
    std::vector<std::pair<std::string, std::vector<step>>> loaded;
    for (const std::string& path : traces) loaded.emplace_back(refpool::bench::trace_name(path), read_trace(path));
    fmt::print("\nsize classes: held/live under one changed option (random: mean of {} seeds)\n", seeds);
    std::string header = fmt::format("{:<36} | {:>8} {:>8} {:>8}", "heap, option", "1M", "64M", "mixed");
    for (const auto& [name, steps] : loaded) header += fmt::format(" {:>14}", name);
    fmt::print("{}\n", header);
    struct variant {
      std::string label;
      segment_heap_options options;
    };
    std::vector<variant> variants;
    const auto add = [&](std::string label, auto change) {
      for (bool vm : {false, true}) {
        segment_heap_options o = vm ? vm_defaults() : plain_defaults();
        change(o);
        variants.push_back({fmt::format("{} {}", vm ? "vm" : "plain", label), o});
      }
    };
    add("defaults", [](segment_heap_options&) {});
    add("granularity 256 B", [](segment_heap_options& o) { o.piece_granularity = 256; });
    add("granularity 4 KiB", [](segment_heap_options& o) { o.piece_granularity = 4096; });
    add("small_max 256 KiB", [](segment_heap_options& o) { o.small_max = 256 << 10; });
    add("one pool (small_max 512 B)", [](segment_heap_options& o) { o.small_max = 512; });
    add("small segments 8 MiB", [](segment_heap_options& o) { o.small_segment = 8 * MiB; });
    add("large segments 64 MiB", [](segment_heap_options& o) { o.large_segment = 64 * MiB; });
    add("large segments 4 MiB", [](segment_heap_options& o) { o.large_segment = 4 * MiB; });
    add("own segment from 16 MiB", [](segment_heap_options& o) { o.own_segment_min = 16 * MiB; });
    add("own segment from 64 MiB", [](segment_heap_options& o) { o.own_segment_min = 64 * MiB; });
    add("no own segments", [](segment_heap_options& o) { o.own_segment_min = SIZE_MAX; });
    for (const variant& v : variants) {
      std::string line = fmt::format("{:<36} |", v.label);
      refpool::bench::json row{{"workload", "sweep"}, {"variant", v.label}, {"seeds", seeds}};
      const auto mean_ratio = [&](std::size_t max, double small_share) {
        double sum = 0;
        for (int seed = 1; seed <= seeds; ++seed) {
          heap_allocator a(v.options, v.label);
          sum += random_allocations(a, max, ops, cap, true, static_cast<unsigned>(seed), small_share).ratio();
        }
        return sum / seeds;
      };
      const double r1 = mean_ratio(1 * MiB, 0), r64 = mean_ratio(64 * MiB, 0), mixed = mean_ratio(64 * MiB, 0.5);
      line += fmt::format(" {:>7.3f}x {:>7.3f}x {:>7.3f}x", r1, r64, mixed);
      row["random_1m"] = r1;
      row["random_64m"] = r64;
      row["mixed"] = mixed;
      for (const auto& [name, steps] : loaded) {
        heap_allocator a(v.options, v.label);
        const double r = replay(a, steps, 30, true).ratio();
        line += fmt::format(" {:>13.3f}x", r);
        row[name] = r;
      }
      fmt::print("{}\n", line);
      json.add(std::move(row));
    }
  }

  if (!json.write(json_path)) fmt::print(stderr, "cannot write {}\n", json_path);
  return 0;
}
