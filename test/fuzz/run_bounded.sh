#!/bin/sh
# Usage: run_bounded.sh FUZZER CORPUS. Runs the libFuzzer target in rounds of REFPOOL_FUZZ_SECONDS
# (60), seeded with CORPUS (read only: new inputs go to a temporary folder that later rounds start
# from), until at least REFPOOL_FUZZ_MIN_OPS (1000000) operations were checked, for at most
# REFPOOL_FUZZ_MAX_SECONDS (240). Passes when nothing crashed and the operations were reached: a
# slow machine fuzzes longer instead of less. A crashing input is kept as fuzz-crash-* in the
# current folder (meson's build folder).
set -u
fuzzer=$1
corpus=$2
seconds=${REFPOOL_FUZZ_SECONDS:-60}
max_seconds=${REFPOOL_FUZZ_MAX_SECONDS:-240}
min_ops=${REFPOOL_FUZZ_MIN_OPS:-1000000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/inputs"
total=0
spent=0
rounds=0
while [ "$total" -lt "$min_ops" ] && [ "$spent" -lt "$max_seconds" ]; do
  "$fuzzer" -max_total_time="$seconds" -max_len=4096 -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$PWD/fuzz-" "$work/inputs" "$corpus" >"$work/log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "the fuzzer failed (exit $rc) in round $((rounds + 1)):"
    grep -v '^#[0-9]' "$work/log" | tail -n 80
    exit 1
  fi
  ops=$(sed -n 's/^refpool fuzz: \([0-9][0-9]*\) operations.*/\1/p' "$work/log" | tail -n 1)
  grep -E '^(refpool fuzz:|Done|stat::)' "$work/log"
  total=$((total + ${ops:-0}))
  spent=$((spent + seconds))
  rounds=$((rounds + 1))
done
if [ "$total" -lt "$min_ops" ]; then
  echo "only $total operations in $spent s ($rounds rounds); at least $min_ops are required"
  exit 1
fi
echo "fuzzed $total operations in $rounds rounds of $seconds s without a mismatch (at least $min_ops required)"
