// The fuzz harness without libFuzzer: runs every file of the given corpus folders (or files),
// then N pseudo-random inputs, so the corpus is a regression test in every build.
//
//   refpool_fuzz_replay [--random N] [--seed S] [--max-len BYTES] PATH...
//
// REFPOOL_FUZZ_RANDOM overrides N. Exits 0 when every input matched the model (a mismatch aborts).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness.hpp"
#include "segment_shadow.hpp"

namespace {

std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t random_inputs = 0;
  std::uint64_t seed = 1;
  std::size_t max_len = 2048;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--random" || arg == "--seed" || arg == "--max-len") && i + 1 < argc) {
      const std::uint64_t value = std::strtoull(argv[++i], nullptr, 10);
      if (arg == "--random") random_inputs = value;
      if (arg == "--seed") seed = value;
      if (arg == "--max-len") max_len = std::max<std::size_t>(1, value);
    } else if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg))
        if (entry.is_regular_file()) files.push_back(entry.path());
    } else if (std::filesystem::is_regular_file(arg)) {
      files.emplace_back(arg);
    } else {
      fmt::print(stderr, "usage: {} [--random N] [--seed S] [--max-len BYTES] PATH...\n'{}' is not a file or folder\n",
                 argv[0], arg);
      return 2;
    }
  }
  if (const char* env = std::getenv("REFPOOL_FUZZ_RANDOM")) random_inputs = std::strtoull(env, nullptr, 10);
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    const std::vector<std::uint8_t> input = read_file(path);
    refpool::test::fuzz::run_input(input.data(), input.size());
  }
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> input;
  for (std::uint64_t n = 0; n < random_inputs; ++n) {
    input.resize(1 + rng() % max_len);
    for (auto& byte : input) byte = static_cast<std::uint8_t>(rng());
    refpool::test::fuzz::run_input(input.data(), input.size());
  }
  fmt::print(stderr, "replayed {} corpus inputs and {} random inputs (seed {})\n", files.size(), random_inputs, seed);
  refpool::test::fuzz::print_totals();
  // Enough inputs to meet every policy the segment cache's training loops exercise: if one never
  // ran, a change made it unreachable and the fuzzer no longer covers it.
  if (random_inputs >= 100) {
    if (const std::string missing = refpool::test::fuzz::missing_segment_coverage(); !missing.empty()) {
      fmt::print(stderr, "refpool fuzz: the segment cache's training loops did not cover their policy:{}\n", missing);
      return 1;
    }
    // Likewise the keys that do not repeat: some pass, and some of those learn again (op_plan_sweep's streams).
    const refpool::test::fuzz::totals& all = refpool::test::fuzz::get_totals();
    if (all.pass_entries == 0 || all.pass_runs == 0 || all.learned_again == 0 || all.capacity_growths == 0) {
      fmt::print(stderr, "refpool fuzz: no key {}\n",
                 all.pass_entries == 0   ? "passed"
                 : all.learned_again == 0 ? "learned again after a pass"
                                          : "kept more plans (a loop longer than 16 sequences)");
      return 1;
    }
    // And the cases of the hostile review (plan_stream): a run open across its key's pass entry, a
    // probe whose request fails, a key that learns again while a pause from before still holds.
    if (all.passing_recordings == 0 || all.failed_probes == 0 || all.pauses_lifted == 0) {
      fmt::print(stderr, "refpool fuzz: no {}\n",
                 all.passing_recordings == 0 ? "recording of a run open at its key's pass entry"
                 : all.failed_probes == 0    ? "probe whose request failed"
                                             : "pause lifted by learning again");
      return 1;
    }
  }
  return 0;
}
