# HIP (docs/hip.md): libamdhip64-dev is in .ci/run's install line, so the plain and ASan builds
# above compile the HIP backend (hip=auto) and load Debian's runtime (libamdhip64-5, which the -dev
# package pulls in): test 'hip-unavailable' asserts it reports no AMD GPU, 'hip-too-old' and
# 'hip-missing-symbol' use a fake runtime, and the 'hip' suite skips (77). The stub (a build without
# HIP) is the TSan build's (-Dhip=disabled), which runs hip-unavailable and hip there. What is extra
# here: check that the plain and ASan builds did compile HIP and the TSan build did not.
# Sourced by .ci/run: appends to its `logs` array.

hip_dir=build-ci-hip
rm -rf "$hip_dir" && mkdir -p "$hip_dir"
hip_log=$hip_dir/testlog.json
for built in build-ci-plain build-ci-asan build-ci-tsan; do
  want=1
  [ "$built" = build-ci-tsan ] && want=0
  result=FAIL
  grep -q "^#define REFPOOL_HAS_HIP $want" "$built/include/refpool/config.hpp" 2>/dev/null && result=OK
  echo "hip-compiled-in ($built, REFPOOL_HAS_HIP $want): $result"
  printf '{"name": "hip-compiled-in-%s", "result": "%s"}\n' "${built#build-ci-}" "$result" >>"$hip_log"
done
logs+=("$hip_log")
