#!/usr/bin/env bash
# On the H200 machine (device tool): build this tree in release mode with tests and benchmarks,
# run the whole test suite (CUDA, planned streams, virtual memory, Python adapters with torch,
# CuPy and Numba), the trace replays on CUDA, and the framework benchmarks. Each part writes its
# own file under $OUT, so a part that runs out of time loses only its own output.
set -uo pipefail
out=${OUT:-h200-out}; mkdir -p "$out"
source .device-deps/setup.sh
export CPATH=$DEPS_PREFIX/usr/include:$CPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)" >>"$out/machine.txt" 2>&1
python3 -c "import numba, numba.cuda; print('numba', numba.__version__)" >>"$out/machine.txt" 2>&1
python3 -c "from numba.cuda.cudadrv import driver as d; print('numba USE_NV_BINDING', getattr(d, 'USE_NV_BINDING', 'absent'), 'binding', hasattr(d, 'binding'))" >>"$out/machine.txt" 2>&1
meson setup /tmp/b --buildtype=release -Db_ndebug=true -Dbenchmarks=enabled >"$out/build.txt" 2>&1 &&
  ninja -C /tmp/b >>"$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
part=${1:-all}
if [ "$part" = all ] || [ "$part" = tests ]; then
  timeout ${TEST_SECONDS:-300} meson test -C /tmp/b --print-errorlogs --num-processes 4 >"$out/tests.txt" 2>&1
  grep -E "^ *[0-9]+/|^Ok|^Fail|^Skip" "$out/tests.txt" | grep -vE " OK " | tail -30
  grep -E "^Ok|^Fail|^Skip" "$out/tests.txt"
fi
if [ "$part" = all ] || [ "$part" = replay ]; then
  timeout ${REPLAY_SECONDS:-120} /tmp/b/bench/trace_replay --cuda --iterations 60 bench/traces/*.csv >"$out/trace_replay_cuda.txt" 2>&1
  timeout ${REPLAY_SECONDS:-90} /tmp/b/bench/trace_replay --cuda --iterations 96 --variants 12 bench/traces/gpt.csv >>"$out/trace_replay_cuda.txt" 2>&1
  timeout ${REPLAY_SECONDS:-90} /tmp/b/bench/trace_replay --cuda --iterations 30 --concat 7 bench/traces/gpt.csv >>"$out/trace_replay_cuda.txt" 2>&1
  tail -40 "$out/trace_replay_cuda.txt"
fi
if [ "$part" = all ] || [ "$part" = frameworks ]; then
  lib=$(find /tmp/b/python -name 'librefpool.so' | head -1)
  timeout ${FRAMEWORK_SECONDS:-240} python3 bench/frameworks/run_all.py --library "$lib" ${FRAMEWORK_ARGS:---quick} \
    --out "$out/frameworks.json" >"$out/frameworks.txt" 2>&1
  tail -40 "$out/frameworks.txt"
fi
