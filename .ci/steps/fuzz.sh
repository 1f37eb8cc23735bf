# Fuzzing (test/fuzz/): a clang build whose libFuzzer target checks refpool against the reference
# model, planned scopes, steps and segments included. Its bounded run (REFPOOL_FUZZ_SECONDS, 60 s;
# at least REFPOOL_FUZZ_MIN_OPS, 2 x 10^5 operations: a floor that catches a harness gone idle, not
# a speed target; printed with the planned runs, region hits and conflicts it checked) is one test
# in the tally. Only the fuzzer is built here: the corpus replay
# already runs in the plain and ASan builds (test 'fuzz-corpus').
# Sourced by .ci/run: uses its `as_root` and appends to its `logs` array.

as_root apt-get install -y -q clang libclang-rt-14-dev || exit 1
fuzz_dir=build-ci-fuzz
rm -rf "$fuzz_dir"
echo "=== $fuzz_dir: CC=clang CXX=clang++ meson setup (libFuzzer target only)"
CC=clang CXX=clang++ meson setup "$fuzz_dir" -Dbenchmarks=disabled -Ddemo=disabled || { echo "setup of $fuzz_dir failed"; exit 1; }
meson compile -C "$fuzz_dir" test/fuzz/refpool_fuzz || { echo "build of the fuzzer failed"; exit 1; }
REFPOOL_FUZZ_SECONDS=${REFPOOL_FUZZ_SECONDS:-60} meson test -C "$fuzz_dir" --no-rebuild --print-errorlogs --suite fuzzing
grep -h -E '^(fuzzed|refpool fuzz:)' "$fuzz_dir/meson-logs/testlog.txt"  # the operation counts
logs+=("$fuzz_dir/meson-logs/testlog.json")
