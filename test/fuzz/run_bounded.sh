#!/bin/sh
# Usage: run_bounded.sh FUZZER CORPUS. Runs the libFuzzer target for REFPOOL_FUZZ_SECONDS (60),
# seeded with CORPUS (read only: new inputs go to a temporary folder), and passes when nothing
# crashed and at least REFPOOL_FUZZ_MIN_OPS (200000) operations were checked. A crashing input
# is kept as fuzz-crash-* in the current folder (meson's build folder).
set -u
fuzzer=$1
corpus=$2
seconds=${REFPOOL_FUZZ_SECONDS:-60}
min_ops=${REFPOOL_FUZZ_MIN_OPS:-200000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$fuzzer" -max_total_time="$seconds" -max_len=4096 -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix="$PWD/fuzz-" "$work" "$corpus" >"$work/log" 2>&1
rc=$?
ops=$(sed -n 's/^refpool fuzz: \([0-9][0-9]*\) operations.*/\1/p' "$work/log" | tail -n 1)
if [ $rc -ne 0 ]; then
  echo "the fuzzer failed (exit $rc):"
  grep -v '^#[0-9]' "$work/log" | tail -n 80
  exit 1
fi
grep -E '^(refpool fuzz:|Done|stat::)' "$work/log"
if [ -z "$ops" ] || [ "$ops" -lt "$min_ops" ]; then
  echo "only ${ops:-no} operations in $seconds s; at least $min_ops are required"
  exit 1
fi
echo "fuzzed $ops operations in $seconds s without a mismatch (at least $min_ops required)"
