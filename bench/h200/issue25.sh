#!/usr/bin/env bash
# On the H200 machine (device tool): issue 25's real-program checks, in parts that each write their
# own files under $OUT.
#   steps     the GPT-2 varlen allocation log replayed on CUDA step by step (driver calls, no
#             kernels), default and plain-step rows: what a step that learns a sequence costs
#   serving   the GPT-2 serving trace on CUDA, every row with the peers, and as 48 sequences
#   generate  GPT-2 generation in real PyTorch (run_all.py, ROUNDS rounds)
#   varlen    GPT-2 training with 13 sequence lengths in real PyTorch (run_all.py, ROUNDS rounds)
# Usage: bash bench/h200/issue25.sh PART...   (ROUNDS=2 by default)
set -uo pipefail
out=${OUT:-h200-out}; mkdir -p "$out"
source .device-deps/setup.sh
export CPATH=$DEPS_PREFIX/usr/include:$CPATH PYTHONUNBUFFERED=1
torch_dir=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
[ -d /tmp/b/meson-private ] && reconfigure=--reconfigure || reconfigure=
meson setup $reconfigure /tmp/b --buildtype=release -Db_ndebug=true -Dbenchmarks=enabled -Dtests=disabled \
  -Dpython=enabled -Ddemo=disabled ${torch_dir:+-Dtorch_dir=$torch_dir} >"$out/build.txt" 2>&1 &&
  ninja -C /tmp/b >>"$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
lib=$(find /tmp/b/python -name 'librefpool.so' | head -1)
rounds=${ROUNDS:-2}
for part in "$@"; do
  case $part in
    steps)
      for row in default "plain step"; do
        PYTHONPATH=python REFPOOL_LIBRARY=$lib timeout 120 python3 bench/traces/replay_log.py --runtime cuda \
          --steps "$row" --json "$out/steps_${row/ /_}.json" >"$out/steps_${row/ /_}.txt" 2>&1
        echo "== $row (CUDA): steps over 5 ms, and the sum"
        awk 'NR == 1 || $NF > 5' "$out/steps_${row/ /_}.txt"
        awk 'NR > 1 { s += $NF } END { printf "sum %.1f ms over %d steps\n", s, NR - 1 }' "$out/steps_${row/ /_}.txt"
      done ;;
    serving)
      timeout 200 /tmp/b/bench/trace_replay --cuda --json "$out/serving.json" bench/traces/gpt2_serving.csv.xz \
        >"$out/serving.txt" 2>&1
      for row in default planned; do
        timeout 90 /tmp/b/bench/trace_replay --cuda --only $row --variants 3 --json "$out/serving_x3_$row.json" \
          bench/traces/gpt2_serving.csv.xz >>"$out/serving.txt" 2>&1
      done
      cat "$out/serving.txt" ;;
    generate | varlen)
      name=gpt2_generate; extra=(--warmup 6 --steps 24)
      [ $part = varlen ] && name=gpt2_train_varlen extra=()
      timeout 560 python3 bench/frameworks/run_all.py --library "$lib" --rounds "$rounds" "${extra[@]}" --only $name \
        --out "$out/$part.json" >"$out/$part.txt" 2>&1
      tail -8 "$out/$part.txt" ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
