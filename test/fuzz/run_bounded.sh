#!/bin/sh
# Usage: run_bounded.sh FUZZER CORPUS. Runs the libFuzzer target in rounds of REFPOOL_FUZZ_SECONDS
# (30), each round as REFPOOL_FUZZ_WORKERS processes at once (default: one per CPU), seeded with
# CORPUS (read only: new inputs go to a temporary folder that later rounds start from), until at
# least REFPOOL_FUZZ_MIN_OPS (1000000) operations were checked, for at most
# REFPOOL_FUZZ_MAX_SECONDS (240). Passes when nothing crashed and the operations were reached: a
# slow machine fuzzes longer instead of less. A crashing input is kept as fuzz-crash-* in the
# current folder (meson's build folder).
set -u
fuzzer=$1
corpus=$2
seconds=${REFPOOL_FUZZ_SECONDS:-30}
max_seconds=${REFPOOL_FUZZ_MAX_SECONDS:-240}
min_ops=${REFPOOL_FUZZ_MIN_OPS:-1000000}
workers=${REFPOOL_FUZZ_WORKERS:-$(nproc 2>/dev/null || echo 1)}
work=$(mktemp -d)
pids=
trap 'kill $pids 2>/dev/null; rm -rf "$work"' EXIT
mkdir "$work/inputs"
total=0
spent=0
rounds=0
while [ "$total" -lt "$min_ops" ] && [ "$spent" -lt "$max_seconds" ]; do
  rounds=$((rounds + 1))
  w=1
  pids=
  while [ "$w" -le "$workers" ]; do
    "$fuzzer" -seed="$((rounds * 1000 + w))" -max_total_time="$seconds" -max_len=4096 -timeout=60 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$PWD/fuzz-" "$work/inputs" "$corpus" \
      >"$work/log.$w" 2>&1 &
    pids="$pids $!"
    w=$((w + 1))
  done
  w=1
  for pid in $pids; do
    status=0
    wait "$pid" || status=$?
    if [ "$status" -ne 0 ] || ! grep -q '^refpool fuzz: [0-9]* operations' "$work/log.$w"; then
      echo "the fuzzer failed (exit $status) in round $rounds, worker $w of $workers:"
      grep -v '^#[0-9]' "$work/log.$w" | tail -n 80
      exit 1
    fi
    ops=$(sed -n 's/^refpool fuzz: \([0-9][0-9]*\) operations.*/\1/p' "$work/log.$w" | tail -n 1)
    total=$((total + ops))
    grep -E '^(refpool fuzz:|Done)' "$work/log.$w"
    w=$((w + 1))
  done
  spent=$((spent + seconds))
done
if [ "$total" -lt "$min_ops" ]; then
  echo "only $total operations in $spent s ($rounds rounds of $workers workers); at least $min_ops are required"
  exit 1
fi
echo "fuzzed $total operations in $rounds rounds of $seconds s on $workers workers without a mismatch (at least $min_ops required)"
