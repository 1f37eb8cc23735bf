#!/usr/bin/env bash
# Instructions per steady-state request of trace_replay's default, plain step and planned rows, for one
# or more builds side by side: callgrind counts only the steady-state iterations (trace_replay
# brackets them with callgrind's start and stop requests), so the count is exact and does not
# depend on the machine's load. It includes the replay loop's own work (about 70 instructions).
# Cases: the training traces, and the serving trace as 16 request shapes in turn (as captured), 24
# shapes in turn (more than a key's 16 plans: --variants 2 --sequences 24), the same 24 in random order
# (serving24r: --shuffle 1) and a stream of shapes that never comes twice (--fresh). ROWS and CASES
# (names below) narrow the table; TRACES adds trace files
# (each replayed as captured), e.g. the H200 serving captures. "calls" are the steady state's driver
# calls, "late" those of its second half (trace_replay's "late allocs").
# Usage: [ROWS="default;plain step"] [CASES="gpt serving24"] [ITERATIONS=12] bash bench/host/instructions.sh BUILD_DIR...
#        (builds with -Dbenchmarks=enabled)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
t=$here/bench/traces
IFS=';' read -ra rows <<< "${ROWS:-default;plain step;planned}"
read -ra cases <<< "${CASES:-gpt gpt_varlen resnet18 serving16 serving24 serving24r servingfresh}"
for f in ${TRACES:-}; do cases+=("$f"); done
args_of() {
  case $1 in
    serving16) echo "$t/gpt2_serving.csv.xz" ;;
    serving24) echo "$t/gpt2_serving.csv.xz --variants 2 --sequences 24" ;;
    serving24r) echo "$t/gpt2_serving.csv.xz --variants 2 --sequences 24 --shuffle 1" ;;
    servingfresh) echo "$t/gpt2_serving.csv.xz --fresh" ;;
    *.csv | *.csv.xz) echo "$1" ;;
    *) echo "$t/$1.csv.xz" ;;
  esac
}
printf '%-16s %-11s' case row
for b in "$@"; do printf ' %14s %7s %5s' "$(basename "$b")" calls late; done
echo
for c in "${cases[@]}"; do
  for row in "${rows[@]}"; do
    name=$(basename "$c"); name=${name%.xz}; printf '%-16s %-11s' "${name%.csv}" "$row"
    for b in "$@"; do
      # shellcheck disable=SC2046  # the case's arguments are words
      out=$(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null \
        "$b/bench/trace_replay" --json /dev/null --only "$row" --iterations "${ITERATIONS:-12}" $(args_of "$c") 2>&1)
      ir=$(echo "$out" | awk '/Collected/ { print $4 }')
      # The result line: requests measured last, then plan hits, late and steady driver calls.
      line=$(echo "$out" | grep '\.csv' | grep -v trace_replay | tail -n 1)
      requests=$(echo "$line" | awk '{ print $NF }')
      calls=$(echo "$line" | awk '{ print $(NF-3) }')
      late=$(echo "$line" | awk '{ print $(NF-2) }')
      awk -v ir="$ir" -v n="$requests" -v d="$calls" -v l="$late" 'BEGIN { printf " %14.1f %7s %5s", ir / n, d, l }'
    done
    echo
  done
done
