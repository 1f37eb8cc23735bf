// What committing and decommitting GPU memory costs through refpool's CUDA virtual memory
// (cuMemCreate + cuMemMap + cuMemSetAccess, then cuCtxSynchronize + cuMemUnmap + cuMemRelease),
// by commit size, for a fixed total: is a plan arena's lending (issue 25) paid per call or per byte?
// Usage: vm_commit_cost [--json FILE] [TOTAL_MIB]   (default 8192 MiB, idle device)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <refpool/cuda.hpp>
#include <refpool/resource.hpp>
#include <refpool/virtual_memory.hpp>

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::size_t total_mib = 8192;
  CLI::App app{"What committing and decommitting GPU memory costs, by commit size"};
  app.add_option("--json", json_path, "Write the rows to this file");
  app.add_option("total_mib", total_mib, "Bytes committed in all, in MiB")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (!refpool::cuda::available()) {
    fmt::print("vm_commit_cost needs a CUDA device: {}\n", refpool::cuda::unavailable_reason());
    return 0;
  }
  const refpool::backend device = refpool::cuda::device(0);
  refpool::virtual_memory* vm = device.underlying().address_space();
  if (vm == nullptr) {
    fmt::print("device 0 offers no virtual memory\n");
    return 0;
  }
  const std::size_t total = total_mib << 20;
  void* base = vm->reserve(total);
  fmt::print("{:>10} {:>8} {:>12} {:>12} {:>14} {:>14}\n", "chunk MiB", "chunks", "commit ms", "decommit ms",
             "commit us/call", "us per GiB");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const std::size_t chunk_mib : {2, 8, 32, 64, 256, 1024, 4096}) {
    if (chunk_mib > total_mib) break;
    const std::size_t chunk = chunk_mib << 20, n = total / chunk;
    double commit_s = 0, decommit_s = 0;
    for (int round = 0; round < 3; ++round) {  // the fastest of 3
      auto t = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < n; ++i)
        if (!vm->commit(static_cast<char*>(base) + i * chunk, chunk)) {
          fmt::print("out of memory at chunk {}\n", i);
          return 1;
        }
      const double c = seconds_since(t);
      t = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < n; ++i) vm->decommit(static_cast<char*>(base) + i * chunk, chunk);
      const double d = seconds_since(t);
      if (round == 0 || c < commit_s) commit_s = c;
      if (round == 0 || d < decommit_s) decommit_s = d;
    }
    fmt::print("{:>10} {:>8} {:>12.2f} {:>12.2f} {:>14.1f} {:>14.0f}\n", chunk_mib, n, commit_s * 1e3, decommit_s * 1e3,
               commit_s * 1e6 / n, commit_s * 1e6 / (total_mib / 1024.0));
    rows.push_back(
        {{"chunk_mib", chunk_mib}, {"chunks", n}, {"commit_ms", commit_s * 1e3}, {"decommit_ms", decommit_s * 1e3}});
  }
  vm->release(base, total);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << nlohmann::ordered_json{{"device", refpool::cuda::device_name(0)}, {"total_mib", total_mib}, {"rows", rows}}
             .dump(2)
      << "\n";
  }
}
