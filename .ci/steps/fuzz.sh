# Fuzzing (test/fuzz/): a clang build whose libFuzzer target checks refpool against the reference
# model, planned scopes, steps and segments included. Its bounded run is one test in the tally:
# rounds of REFPOOL_FUZZ_SECONDS (30 s), one fuzzer process per CPU, until REFPOOL_FUZZ_MIN_OPS
# (10^6) operations were checked, at most REFPOOL_FUZZ_MAX_SECONDS (240 s); it prints the planned
# runs, region hits and conflicts it checked. Only the fuzzer is built here: the corpus replay
# runs in the plain build (test 'fuzz-corpus'), and every round here replays the corpus under ASan.
# Sourced by .ci/run: uses its `as_root` and appends to its `logs` array.

as_root apt-get install -y -q clang libclang-rt-14-dev || exit 1
fuzz_dir=build-ci-fuzz
rm -rf "$fuzz_dir"
echo "=== $fuzz_dir: CC=clang CXX=clang++ meson setup (libFuzzer target only)"
CC=clang CXX=clang++ meson setup "$fuzz_dir" -Dbenchmarks=disabled -Ddemo=disabled || { echo "setup of $fuzz_dir failed"; exit 1; }
meson compile -C "$fuzz_dir" test/fuzz/refpool_fuzz || { echo "build of the fuzzer failed"; exit 1; }
REFPOOL_FUZZ_SECONDS=${REFPOOL_FUZZ_SECONDS:-30} meson test -C "$fuzz_dir" --no-rebuild --print-errorlogs --suite fuzzing
grep -h -E '^(fuzzed|refpool fuzz:)' "$fuzz_dir/meson-logs/testlog.txt"  # the operation counts
logs+=("$fuzz_dir/meson-logs/testlog.json")
