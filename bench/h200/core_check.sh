#!/usr/bin/env bash
# On the H200 machine (device tool): builds this tree and the previous release's tree (.prev, a
# `git archive` of it) in release mode, runs the GPU test suite, then the hit-path benchmarks of
# both, interleaved, in one run. Output tables go to $OUT (or ./h200-out).
set -uo pipefail
out=${OUT:-h200-out}; mkdir -p "$out"
source .device-deps/setup.sh
export CPATH=$DEPS_PREFIX/usr/include:$CPATH
nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
meson setup /tmp/new --buildtype=release -Db_ndebug=true -Dbenchmarks=enabled >/dev/null &&
  ninja -C /tmp/new >/tmp/new.log 2>&1 || { tail -30 /tmp/new.log; exit 1; }
if [ -d .prev ]; then
  (cd .prev && meson setup /tmp/old --buildtype=release -Db_ndebug=true -Dbenchmarks=enabled -Dtests=disabled >/dev/null &&
    ninja -C /tmp/old bench/host_hit_path bench/gpu/gpu_bench >/tmp/old.log 2>&1) || tail -20 /tmp/old.log
fi
meson test -C /tmp/new --print-errorlogs 2>&1 | tee "$out/gpu-tests.txt" | grep -E "^ *[0-9]+/|^Ok|^Fail|^Skip"
for round in 1 2; do
  for tree in new old; do
    [ -x /tmp/$tree/bench/host_hit_path ] || continue
    echo "== round $round: $tree host_hit_path" | tee -a "$out/hit_path.txt"
    /tmp/$tree/bench/host_hit_path "$out/host_hit_path_${tree}_$round.json" 2>&1 | tee -a "$out/hit_path.txt"
    echo "== round $round: $tree gpu_bench hit_path" | tee -a "$out/hit_path.txt"
    [ "$round" = 1 ] && /tmp/$tree/bench/gpu/gpu_bench --json "$out/gpu_hit_path_${tree}.json" hit_path 2>&1 | tee -a "$out/hit_path.txt"
  done
done
echo "== new host_hit_path with REFPOOL_OWNER_LOCK=fence" | tee -a "$out/hit_path.txt"
REFPOOL_OWNER_LOCK=fence /tmp/new/bench/host_hit_path "$out/host_hit_path_fence.json" 2>&1 | head -8 | tee -a "$out/hit_path.txt"
if [ -n "${REFPOOL_FRAMEWORKS_QUICK:-}" ]; then
  lib=$(find /tmp/new/python -name 'librefpool.so' | head -1)
  echo "== frameworks --quick with $lib"
  PYTHONUNBUFFERED=1 timeout 240 python3 bench/frameworks/run_all.py --library "$lib" --quick 2>&1 | tail -60 | tee "$out/frameworks_quick.txt"
fi
