// Timing helpers for the benchmarks: median of repeated samples, and the JSON rows they write.
// The median is the few lines below (Google Benchmark, Debian's libbenchmark-dev, would own the
// benchmarks' loops and output; they compare allocators side by side in one table instead). The
// JSON is nlohmann's (Debian's nlohmann-json3-dev, header-only), which escapes what it writes.
#pragma once

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace refpool::bench {

/// Median nanoseconds per operation of `body(ops)` over `samples` runs of `ops` operations each.
template <class Body>
double median_ns_per_op(Body&& body, std::size_t ops, int samples = 21) {
  std::vector<double> ns;
  body(ops);  // warm-up
  for (int i = 0; i < samples; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body(ops);
    const auto stop = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(ops));
  }
  std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
  return ns[ns.size() / 2];
}

/// Keeps the compiler from dropping a value.
template <class T>
inline void keep(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

/// A JSON object whose keys keep the order they were added in (the column order of the tables).
using json = nlohmann::ordered_json;

/// One JSON object per row, in an array.
class json_rows {
 public:
  void add(json row) { rows_.push_back(std::move(row)); }
  /// Writes the rows to `path`; false if it cannot be written.
  bool write(const std::string& path) const {
    std::ofstream f(path);
    f << rows_.dump(2) << "\n";
    return static_cast<bool>(f);
  }

 private:
  json rows_ = json::array();
};

}  // namespace refpool::bench
