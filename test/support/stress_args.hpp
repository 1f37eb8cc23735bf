// The command line of the stress programs (not Catch2 tests): `--threads N --ops N`, with the
// operation count overridden by an environment variable (what meson.build sizes per sanitizer).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

namespace refpool::test {

struct stress_args {
  int threads;
  std::uint64_t ops;
};

/// `defaults` changed by `--threads` and `--ops`, then `ops` by $`ops_env` when it is set.
inline stress_args parse_stress_args(int argc, char** argv, stress_args defaults, const char* ops_env) {
  stress_args out = defaults;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--threads")
      out.threads = std::atoi(argv[i + 1]);
    else if (arg == "--ops")
      out.ops = std::strtoull(argv[i + 1], nullptr, 10);
  }
  if (const char* env = std::getenv(ops_env)) out.ops = std::strtoull(env, nullptr, 10);
  return out;
}

}  // namespace refpool::test
