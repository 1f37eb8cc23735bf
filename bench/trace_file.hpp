// The captured training-step traces (bench/traces/*.csv.xz: step,event,index,bytes), read into steps
// of events, for the benchmarks that replay them (trace_replay, segment_bench). The traces are kept
// xz-compressed (19x smaller than the text, 1.7x smaller than gzip) and decompressed by the xz tool
// (`xz -dc`), which every Debian and Ubuntu machine has (the GPU machines lack liblzma-dev); a
// plain .csv (a fresh capture) reads too.
#pragma once

#include <stdio.h>  // popen, pclose

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <iterator>
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

/// The text of `path`, decompressed by `xz -dc` when it ends in ".xz". Throws std::runtime_error if
/// it cannot be read or decompressed.
inline std::string read_text(const std::string& path) {
  if (!path.ends_with(".xz")) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw std::runtime_error("cannot read " + path);
    return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  }
  std::string quoted = "'";  // for the shell: every ' closed, escaped and reopened
  for (char c : path) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  std::FILE* pipe = ::popen(("xz -dc -- " + quoted).c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run xz for " + path);
  std::string text;
  char chunk[1 << 16];
  for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, pipe)) > 0;) text.append(chunk, n);
  if (::pclose(pipe) != 0) throw std::runtime_error("xz -dc could not decompress " + path);
  return text;
}

/// The name tables show for a trace file: "gpt.csv" for bench/traces/gpt.csv.xz.
inline std::string trace_name(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  return name.ends_with(".xz") ? name.substr(0, name.size() - 3) : name;
}

/// The steps of a trace file (.csv or .csv.xz), in order. Throws std::runtime_error if the file
/// cannot be read.
inline std::vector<trace_step> read_trace(const std::string& path) {
  std::istringstream in(read_text(path));
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
