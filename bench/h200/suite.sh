#!/usr/bin/env bash
# On the H200 machine (device tool): build this tree in release mode with tests and benchmarks,
# run the whole test suite (CUDA, planned streams, virtual memory, Python adapters with torch,
# CuPy and Numba), the GPU allocator benchmarks (PyTorch's allocator as an anchor), the trace
# replays on CUDA, and the framework benchmarks. Parts: tests gpu replay frameworks (or all), and
# pictures (memory over time of GPT-2 training, plain and planned), pointer (free by pointer),
# serving (captures a GPT-2 serving trace and replays it) and cupy (the CuPy loop by batch).
# Each part writes its own files under $OUT, so a part that runs out of time loses only its own
# output. PACK=1 (on the last call of a command) archives them into $OUT/results.tgz.
set -uo pipefail
out=${OUT:-h200-out}; mkdir -p "$out"
source .device-deps/setup.sh
export CPATH=$DEPS_PREFIX/usr/include:$CPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)" >>"$out/machine.txt" 2>&1
python3 -c "import numba, numba.cuda; print('numba', numba.__version__)" >>"$out/machine.txt" 2>&1
python3 -c "from numba.cuda.cudadrv import driver as d; print('numba USE_NV_BINDING', getattr(d, 'USE_NV_BINDING', 'absent'), 'binding', hasattr(d, 'binding'))" >>"$out/machine.txt" 2>&1
# PyTorch's own allocator as an anchor of the GPU benchmarks (gpu_bench_torch), when torch is there.
torch_dir=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
[ -d /tmp/b/meson-private ] && reconfigure=--reconfigure || reconfigure=
meson setup $reconfigure /tmp/b --buildtype=release -Db_ndebug=true -Dbenchmarks=enabled ${torch_dir:+-Dtorch_dir=$torch_dir} ${MESON_ARGS:-} \
  >"$out/build.txt" 2>&1 &&
  ninja -C /tmp/b >>"$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
part=${1:-all}
if [ "$part" = all ] || [ "$part" = tests ]; then
  timeout ${TEST_SECONDS:-480} meson test -C /tmp/b --print-errorlogs --num-processes 4 >"$out/tests.txt" 2>&1
  grep -E "^ *[0-9]+/|^Ok|^Fail|^Skip" "$out/tests.txt" | grep -vE " OK " | tail -30
  grep -E "^Ok|^Fail|^Skip" "$out/tests.txt"
fi
if [ "$part" = all ] || [ "$part" = gpu ]; then
  bench=/tmp/b/bench/gpu/gpu_bench; [ -x /tmp/b/bench/gpu/gpu_bench_torch ] && bench=/tmp/b/bench/gpu/gpu_bench_torch
  for w in ${GPU_WORKLOADS:-random hit_path}; do
    timeout ${GPU_SECONDS:-150} $bench --json "$out/$w.json" $w >"$out/$w.txt" 2>&1
    tail -30 "$out/$w.txt"
  done
  if [ -n "${HOST_HIT_PATH:-}" ]; then  # the host hit path, by handle and by pointer (free_pointer)
    timeout ${GPU_SECONDS:-150} /tmp/b/bench/host_hit_path "$out/host_hit_path.json" >"$out/host_hit_path.txt" 2>&1
    head -20 "$out/host_hit_path.txt"
  fi
fi
if [ "$part" = all ] || [ "$part" = replay ]; then  # every row: default, plain step, cache ..., planned (issue 25)
  timeout ${REPLAY_SECONDS:-180} /tmp/b/bench/trace_replay --cuda --iterations 60 --json "$out/trace_replay_cuda.json" \
    bench/traces/{gpt,gpt2_serving,gpt_varlen,resnet18}.csv.xz >"$out/trace_replay_cuda.txt" 2>&1
  timeout ${REPLAY_SECONDS:-90} /tmp/b/bench/trace_replay --cuda --iterations 96 --variants 12 bench/traces/gpt.csv.xz >>"$out/trace_replay_cuda.txt" 2>&1
  timeout ${REPLAY_SECONDS:-90} /tmp/b/bench/trace_replay --cuda --iterations 30 --concat 7 bench/traces/gpt.csv.xz >>"$out/trace_replay_cuda.txt" 2>&1
  # 48 request sequences that never repeat within a key's 16 pending ones (issue 25's serving case)
  for row in default "plain step" planned; do
    timeout ${REPLAY_SECONDS:-90} /tmp/b/bench/trace_replay --cuda --only "$row" --variants 3 --json "$out/trace_replay_serving_x3_${row/ /_}.json" \
      bench/traces/gpt2_serving.csv.xz >>"$out/trace_replay_cuda.txt" 2>&1
  done
  tail -50 "$out/trace_replay_cuda.txt"
fi
if [ "$part" = all ] || [ "$part" = frameworks ]; then
  lib=$(find /tmp/b/python -name 'librefpool.so' | head -1)
  timeout ${FRAMEWORK_SECONDS:-240} python3 bench/frameworks/run_all.py --library "$lib" ${FRAMEWORK_ARGS:---quick} \
    --out "$out/frameworks.json" >"$out/frameworks.txt" 2>&1
  tail -40 "$out/frameworks.txt"
fi
if [ "$part" = pictures ]; then
  lib=$(find /tmp/b/python -name 'librefpool.so' | head -1)
  for mode in refpool refpool-planned; do
    REFPOOL_LIBRARY=$lib PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} REFPOOL_CONF=log:$out/log-$mode.csv \
      timeout 150 python3 bench/frameworks/gpt2_train.py --mode $mode --warmup 2 --steps 4 \
      --out "$out/picture-$mode.json" --stats-out "$out/stats-$mode.json" >>"$out/pictures.txt" 2>&1
    PYTHONPATH=python python3 -m refpool.plot "$out/log-$mode.csv" "$out/gpt2_train_$mode.png" \
      --stats "$out/stats-$mode.json" --title "GPT-2 small training (batch 8 x 256), $mode, H200" >>"$out/pictures.txt" 2>&1
  done
  tail -6 "$out/pictures.txt"
fi
if [ "$part" = serving ]; then  # capture a serving trace (GPT-2 generation, random batch x prompt), replay it
  timeout ${SERVING_SECONDS:-180} python3 bench/traces/capture_serving.py "$out" --requests ${SERVING_REQUESTS:-40} >"$out/serving.txt" 2>&1
  tail -3 "$out/serving.txt"
  [ -f "$out/gpt2_serving.csv" ] && timeout ${REPLAY_SECONDS:-120} /tmp/b/bench/trace_replay --cuda \
    --json "$out/trace_replay_serving.json" "$out/gpt2_serving.csv" >>"$out/serving.txt" 2>&1
  tail -6 "$out/serving.txt"
fi
if [ "$part" = cupy ]; then  # the CuPy MLP loop, own pool against refpool, by batch (issue 26)
  lib=$(find /tmp/b/python -name 'librefpool.so' | head -1)
  timeout ${CUPY_SECONDS:-150} python3 bench/frameworks/cupy_small_batches.py --library "$lib" --rounds ${ROUNDS:-3} \
    --out "$out/cupy_small_batches.json" >"$out/cupy_small_batches.txt" 2>&1
  tail -8 "$out/cupy_small_batches.txt"
  REFPOOL_LIBRARY=$lib timeout ${CUPY_SECONDS:-150} python3 bench/frameworks/cupy_interleaved.py \
    --out "$out/cupy_interleaved.json" >"$out/cupy_interleaved.txt" 2>&1
  cat "$out/cupy_interleaved.txt"
fi
if [ "$part" = pointer ]; then  # one alloc + free pair on one thread: by handle, cache-level, by pointer
  TIMEFORMAT="%R"
  for round in 1 2 3; do
    for kind in handle cache-level pointer; do
      seconds=$( { time /tmp/b/bench/host_hit_path --pairs 50000000 $kind >/dev/null; } 2>&1 )
      echo "round $round $kind: $seconds s for 5e7 pairs" | tee -a "$out/pointer.txt"
    done
  done
fi
# The device tool brings back a limited number of files: PACK=1 leaves one archive (and
# console.txt, where the caller writes the console) instead of the many files the parts write.
if [ -n "${PACK:-}" ]; then
  tar czf /tmp/suite-results.tgz -C "$out" --exclude=console.txt . &&
    find "$out" -mindepth 1 ! -name console.txt -delete && mv /tmp/suite-results.tgz "$out/results.tgz"
fi
