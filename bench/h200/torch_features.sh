#!/usr/bin/env bash
# On the H200 machine (device tool): refpool's PyTorch features (issue 26) in one call. Builds only
# the Python package's library, builds refpool's PyTorch hooks once, runs the GPT-2 decode-graph
# benchmark (own vs refpool, side by side), then the PyTorch tests and the host Python tests. Each
# part logs to its own file under $OUT; PART=bench|tests|cupy|all (default all, cupy only when
# named); TESTS=pytest -k filter.
set -uo pipefail
out=${OUT:-h200-out}; mkdir -p "$out"
source .device-deps/setup.sh
export PYTHONUNBUFFERED=1 REFPOOL_TORCH_HOOKS_DIR=/tmp/refpool-hooks
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/machine.txt"
git log -1 --format='commit %H %s' 2>/dev/null | tee -a "$out/machine.txt" || true
cat COMMIT 2>/dev/null | tee -a "$out/machine.txt" || true
start=$SECONDS
{ meson setup /tmp/b --buildtype=release -Db_ndebug=true -Dtests=disabled -Dbenchmarks=disabled -Ddemo=disabled &&
  ninja -C /tmp/b python/librefpool.so; } >"$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; exit 1; }
echo "library built in $((SECONDS - start)) s"
export REFPOOL_LIBRARY=/tmp/b/python/librefpool.so PYTHONPATH=$PWD/python
start=$SECONDS
python3 -W always -c "import torch, refpool.torch as t; from refpool import _torch_hooks as h; print(h.load(torch)[0])" \
  >>"$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
echo "hooks built in $((SECONDS - start)) s"; tail -3 "$out/build.txt"
part=${PART:-all}
case " $part " in *" cupy "*)
  timeout ${CUPY_SECONDS:-120} python3 bench/frameworks/cupy_small_batches.py --rounds ${ROUNDS:-2} \
    --out "$out/cupy_small_batches.json" >"$out/cupy_small_batches.txt" 2>&1
  tail -8 "$out/cupy_small_batches.txt";;
esac
if [ "$part" = all ] || [[ " $part " == *" bench "* ]]; then
  timeout ${BENCH_SECONDS:-120} python3 bench/frameworks/gpt2_decode_graphs.py --rounds ${ROUNDS:-2} \
    --out "$out/gpt2_decode_graphs.json" >"$out/gpt2_decode_graphs.txt" 2>&1
  tail -12 "$out/gpt2_decode_graphs.txt"
fi
if [ "$part" = all ] || [[ " $part " == *" tests "* ]]; then
  timeout ${TEST_SECONDS:-300} python3 -m pytest -v -rs -s -p no:cacheprovider ${TESTS:+-k "$TESTS"} \
    test/python/test_arguments.py test/python/test_entry_points.py test/python/test_torch.py \
    >"$out/tests.txt" 2>&1
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$out/tests.txt" | grep -v "test_arguments.py::" | tail -40
fi
