// The captured training-step traces (bench/traces/*.csv: step,event,index,bytes), read into steps
// of events, for the benchmarks that replay them (trace_replay, segment_bench).
#pragma once

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace refpool::bench {

/// One request of a step: an allocation of `bytes` into slot `index`, or the free of that slot.
struct trace_event {
  bool alloc;
  std::size_t index;
  std::size_t bytes;
};
using trace_step = std::vector<trace_event>;

/// The steps of a trace file, in order. Throws std::runtime_error if the file cannot be read.
inline std::vector<trace_step> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::string line;
  std::getline(in, line);  // header
  std::vector<trace_step> steps;
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

/// The largest number of bytes live at once within any one step.
inline std::size_t peak_live(const std::vector<trace_step>& steps) {
  std::size_t peak = 0;
  for (const trace_step& st : steps) {
    std::vector<std::size_t> size_of;
    std::size_t live = 0;
    for (const trace_event& e : st) {
      if (e.alloc) {
        if (size_of.size() <= e.index) size_of.resize(e.index + 1);
        size_of[e.index] = e.bytes;
        live += e.bytes;
        peak = std::max(peak, live);
      } else {
        live -= size_of[e.index];
      }
    }
  }
  return peak;
}

}  // namespace refpool::bench
