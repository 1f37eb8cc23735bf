#!/usr/bin/env bash
# Instructions per steady-state request of trace_replay's default and planned rows, for one or
# more builds side by side: callgrind counts only the steady-state iterations (trace_replay
# brackets them with callgrind's start and stop requests), so the count is exact and does not
# depend on the machine's load. It includes the replay loop's own work (about 70 instructions).
# Usage: bash bench/host/instructions.sh BUILD_DIR...   (builds with -Dbenchmarks=enabled)
set -euo pipefail
traces=(gpt gpt_varlen resnet18)
here=$(cd "$(dirname "$0")/../.." && pwd)
printf '%-12s %-8s' trace row
for b in "$@"; do printf ' %14s' "$(basename "$b")"; done
echo
for t in "${traces[@]}"; do
  for row in default planned; do
    printf '%-12s %-8s' "$t" "$row"
    for b in "$@"; do
      out=$(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null \
        "$b/bench/trace_replay" --only "$row" --iterations 12 "$here/bench/traces/$t.csv.xz" 2>&1)
      ir=$(echo "$out" | awk '/Collected/ { print $4 }')
      requests=$(echo "$out" | awk -v t="$t.csv" '$1 == t { print $NF }')
      awk -v ir="$ir" -v n="$requests" 'BEGIN { printf " %14.1f", ir / n }'
    done
    echo
  done
done
