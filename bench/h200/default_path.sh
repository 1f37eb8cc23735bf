#!/usr/bin/env bash
# On the H200 machine (device tool): the default and planned rows of bench/trace_replay for this
# tree against a base tree, side by side in one run (issue 25's per-request target), on CUDA and
# on the host backend (the same CPU), in interleaved rounds, with --bounds (the time of opening
# and closing each step, in both trees alike).
# Usage: bash bench/h200/default_path.sh BASE_SOURCE_DIR [ROUNDS]   (writes under $OUT)
set -uo pipefail
base_src=$1
rounds=${2:-2}
out=${OUT:-h200-out}; mkdir -p "$out"
source .device-deps/setup.sh
export CPATH=$DEPS_PREFIX/usr/include:$CPATH
options=(--buildtype=release -Db_ndebug=true -Dbenchmarks=enabled -Dtests=disabled -Dpython=disabled -Ddemo=disabled)
for tree in new base; do
  src=.; [ $tree = base ] && src=$base_src
  (meson setup "/tmp/replay-$tree" "$src" "${options[@]}" && ninja -C "/tmp/replay-$tree" bench/trace_replay) \
    >"$out/build-$tree.txt" 2>&1 || { tail -30 "$out/build-$tree.txt"; exit 1; }
done
traces=(bench/traces/gpt.csv.xz bench/traces/gpt_varlen.csv.xz bench/traces/resnet18.csv.xz)
for round in $(seq "$rounds"); do
  for tree in base new; do
    for backend in --cuda ""; do
      for row in default planned; do
        /tmp/replay-$tree/bench/trace_replay $backend --bounds --only $row --json "$out/replay-$tree-${backend:---host}-$row-$round.json" \
          "${traces[@]}" | grep -v '^trace' | sed "s/^/$tree ${backend:---host} round $round: /"
      done
    done
  done
done | tee "$out/default_path.txt"
