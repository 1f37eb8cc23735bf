// Timing helpers for the benchmarks: median of repeated samples, and a JSON writer.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

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

/// One JSON object per row, in an array.
class json_rows {
 public:
  void add(std::string row) { rows_.push_back(std::move(row)); }
  bool write(const std::string& path) const {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return false;
    fmt::print(f, "[\n  {}\n]\n", fmt::join(rows_, ",\n  "));
    std::fclose(f);
    return true;
  }

 private:
  std::vector<std::string> rows_;
};

}  // namespace refpool::bench
