// The segment heap (lib/segments/) on the host backend, side by side with the allocators it
// replaces: RMM's random_allocations pattern (sizes uniform in [1, max], 73% allocations while
// under a live cap, random free order) and the captured training-step traces, reporting peak
// memory held against peak live bytes, ns per operation and backend calls. Compared with:
// idle blocks kept per exact size (refpool's cache without splitting), the same with pow2:4 keys,
// and malloc/free. `--sweep` adds the size-class measurements docs/segments.md cites.
// Usage: segment_bench [--json FILE] [--ops N] [--cap BYTES] [--sweep] [TRACE.csv...]
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <refpool/refpool.hpp>

#include "segments/segment_heap.hpp"
#include "timing.hpp"

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
  void deallocate(const handle& h) { heap_.give_back(h, refpool::stream_ref{}); }
  footprint measure() const {
    const auto st = heap_.stats();
    return {st.committed_bytes, st.segments_made + st.grows};
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
  void deallocate(const handle& h) { idle_[h.key].push_back(h.ptr); }
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
  void deallocate(handle p) { std::free(p); }
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
// the allocator's footprint is sampled after every operation (not timed).
template <class A>
outcome random_allocations(A& a, std::size_t max_bytes, int ops, std::size_t live_cap, bool measure,
                           unsigned seed = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> size(1, max_bytes);
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
      live[i] = live.back();
      live.pop_back();
    }
    if (measure) out.peak_held = std::max(out.peak_held, a.measure().held);
  }
  out.ns_per_op = std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / ops;
  for (auto& [h, bytes] : live) a.deallocate(h);
  out.backend_calls = a.measure().backend_calls;
  return out;
}

// Runs a workload on fresh allocators: once measuring the footprint, then `repeats` times timed;
// the median time.
template <class Make, class Workload>
outcome run(Make make, Workload workload, int repeats) {
  outcome measured;
  {
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

// --- traces (bench/traces/*.csv: step,event,index,bytes) ---

struct event {
  bool alloc;
  std::size_t index;
  std::size_t bytes;
};
using step = std::vector<event>;

std::vector<step> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::string line;
  std::getline(in, line);
  std::vector<step> steps;
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    std::string k, action, index, bytes;
    std::getline(fields, k, ',');
    std::getline(fields, action, ',');
    std::getline(fields, index, ',');
    std::getline(fields, bytes, ',');
    const std::size_t s = std::stoul(k);
    if (steps.size() <= s) steps.resize(s + 1);
    steps[s].push_back({action == "alloc", std::stoul(index), std::stoul(bytes)});
  }
  return steps;
}

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
  int ops = 20000;                 // as on the H200 (docs/benchmarks.md §4)
  std::size_t cap = 8 * GiB;       // the H200 run's live cap
  bool sweep = false;
  std::vector<std::string> traces;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
    else if (std::strcmp(argv[i], "--ops") == 0 && i + 1 < argc) ops = std::stoi(argv[++i]);
    else if (std::strcmp(argv[i], "--cap") == 0 && i + 1 < argc) cap = std::stoull(argv[++i]);
    else if (std::strcmp(argv[i], "--sweep") == 0) sweep = true;
    else traces.emplace_back(argv[i]);
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

  fmt::print("random allocations (RMM pattern): sizes uniform in [1, max], 73% allocations while under a {} GiB live "
             "cap, {} operations, random free order; held/live = peak held / peak live; median of {} timed runs\n",
             cap / GiB, ops, repeats);
  fmt::print("{:<28} | {:>9} {:>9} {:>8} | {:>9} {:>9} {:>8}\n", "allocator", "1M ns/op", "held/live", "calls",
             "64M ns/op", "held/live", "calls");
  const auto row = [&](const std::string& label, auto make) {
    std::string line = fmt::format("{:<28} |", label);
    for (std::size_t max : {1 * MiB, 64 * MiB}) {
      const outcome o = run(make, [&](auto& a, bool m) { return random_allocations(a, max, ops, cap, m); }, repeats);
      line += fmt::format(" {:>9.0f} {:>8.3f}x {:>8} |", o.ns_per_op, o.ratio(), o.backend_calls);
      json.add(fmt::format(R"({{"workload": "random", "max_bytes": {}, "ops": {}, "live_cap": {}, "allocator": "{}", )"
                           R"("ns_per_op": {:.1f}, "peak_live_bytes": {}, "peak_held_bytes": {}, "held_over_live": {:.4f}, )"
                           R"("backend_calls": {}}})",
                           max, ops, cap, label, o.ns_per_op, o.peak_live, o.peak_held, o.ratio(), o.backend_calls));
    }
    line.pop_back();
    fmt::print("{}\n", line);
  };
  row("segment heap, virtual mem.", make_heap(vm_defaults(), "heap vm"));
  row("segment heap, allocations", make_heap(plain_defaults(), "heap plain"));
  row("idle blocks, exact keys", make_idle(refpool::rounding_policy::exact(), "exact"));
  row("idle blocks, pow2:4 keys", make_idle(refpool::rounding_policy::pow2(4), "pow2:4"));
  row("malloc/free", [] { return std::make_unique<malloc_allocator>(); });

  if (!traces.empty()) {
    const int iterations = 30;
    fmt::print("\ntraces (bench/traces), {} steps replayed in turn; held/live = peak held / peak live; steady calls = "
               "backend calls after every step was seen twice\n", iterations);
    fmt::print("{:<16} {:<28} | {:>9} {:>9} {:>12}\n", "trace", "allocator", "ns/req", "held/live", "steady calls");
    for (const std::string& path : traces) {
      const auto steps = read_trace(path);
      const std::string name = path.substr(path.find_last_of('/') + 1);
      const auto trace_row = [&](const std::string& label, auto make) {
        const outcome o = run(make, [&](auto& a, bool m) { return replay(a, steps, iterations, m); }, 3);
        fmt::print("{:<16} {:<28} | {:>9.0f} {:>8.3f}x {:>12}\n", name, label, o.ns_per_op, o.ratio(), o.backend_calls);
        json.add(fmt::format(R"({{"workload": "trace", "trace": "{}", "allocator": "{}", "ns_per_request": {:.1f}, )"
                             R"("peak_live_bytes": {}, "peak_held_bytes": {}, "held_over_live": {:.4f}, )"
                             R"("steady_backend_calls": {}}})",
                             name, label, o.ns_per_op, o.peak_live, o.peak_held, o.ratio(), o.backend_calls));
      };
      trace_row("segment heap, virtual mem.", make_heap(vm_defaults(), "heap vm"));
      trace_row("segment heap, allocations", make_heap(plain_defaults(), "heap plain"));
      trace_row("idle blocks, exact keys", make_idle(refpool::rounding_policy::exact(), "exact"));
      trace_row("idle blocks, pow2:4 keys", make_idle(refpool::rounding_policy::pow2(4), "pow2:4"));
    }
  }

  if (sweep) {
    fmt::print("\nsize classes: held/live of the random workloads (max 1 MiB | 64 MiB) under other options\n");
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
    for (const variant& v : variants) {
      std::string line = fmt::format("{:<36} |", v.label);
      for (std::size_t max : {1 * MiB, 64 * MiB}) {
        heap_allocator a(v.options, v.label);
        const outcome o = random_allocations(a, max, ops, cap, true);
        line += fmt::format(" {:>8.3f}x", o.ratio());
        json.add(fmt::format(R"({{"workload": "sweep", "max_bytes": {}, "variant": "{}", "held_over_live": {:.4f}}})",
                             max, v.label, o.ratio()));
      }
      fmt::print("{}\n", line);
    }
  }

  if (!json.write(json_path)) fmt::print(stderr, "cannot write {}\n", json_path);
  return 0;
}
