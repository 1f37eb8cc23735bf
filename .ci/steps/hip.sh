# HIP (docs/hip.md): libamdhip64-dev is in .ci/run's install line, so the plain and ASan builds
# above compile the HIP backend (hip=auto) and load Debian's runtime (libamdhip64-5, which the -dev
# package pulls in): test 'hip-unavailable' asserts it reports no AMD GPU, 'hip-too-old' and
# 'hip-missing-symbol' use a fake runtime, and the 'hip' suite skips (77). What is extra here:
# check that those builds did compile HIP, and build the stub of a build without HIP (debug,
# only its two test programs) and run them.
# Sourced by .ci/run: appends to its `logs` array.

hip_dir=build-ci-hip
rm -rf "$hip_dir" && mkdir -p "$hip_dir"
hip_log=$hip_dir/testlog.json
for built in build-ci-plain build-ci-asan; do
  result=FAIL
  grep -q '^#define REFPOOL_HAS_HIP 1' "$built/include/refpool/config.hpp" 2>/dev/null && result=OK
  echo "hip-compiled-in ($built): $result"
  printf '{"name": "hip-compiled-in-%s", "result": "%s"}\n' "${built#build-ci-}" "$result" >>"$hip_log"
done
logs+=("$hip_log")

stub_dir=$hip_dir/stub
echo "=== $stub_dir: meson setup -Dhip=disabled (the stub; hip tests only)"
meson setup "$stub_dir" -Dhip=disabled -Dbuildtype=debug -Dbenchmarks=disabled -Ddemo=disabled >"$hip_dir/setup.log" 2>&1 ||
  { cat "$hip_dir/setup.log"; echo "setup of $stub_dir failed"; exit 1; }
meson compile -C "$stub_dir" hip_unavailable_test || { echo "build of $stub_dir failed"; exit 1; }
meson test -C "$stub_dir" --no-rebuild --print-errorlogs hip-unavailable hip
logs+=("$stub_dir/meson-logs/testlog.json")
