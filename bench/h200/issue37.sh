#!/usr/bin/env bash
# On the H200 machine (device tool): issue 37's checks in one command (about 7 minutes):
#   1. PyTorch's own allocator tests (both files) with refpool installed (torch_tests.sh,
#      MODES=refpool; PyTorch's column comes from a full torch_tests.sh run);
#   2. refpool's own GPU tests of what issue 37 changed: graph trees' checkpoint restores and
#      reduce-overhead (test_torch.py), graph pools kept while their buffers are held, snapshots
#      with refpool's segments, MemPool, caching_allocator_enable(False), and CuPy graphs captured
#      under refpool_capture_begin (test_cupy.py).
# carry: .ptests .device-deps. PART=ptests or PART=own runs one of the two; TESTS and FILES narrow
# PyTorch's tests (torch_tests.sh), OWN_TESTS the -k of test_torch.py, CUPY=0 leaves test_cupy.py
# out, PROBE=1 adds bench/h200/memory_stats_probe.py.
set -uo pipefail
start=$SECONDS
out=${OUT:-h200-out}; mkdir -p "$out"
part=${PART:-all}
if [ "$part" = all ] || [ "$part" = ptests ]; then
  MODES=refpool TOTAL=${PTESTS_SECONDS:-240} OUT=$out bash bench/h200/torch_tests.sh 2>&1 | tail -48
fi
if [ "$part" = all ] || [ "$part" = own ]; then
  source .device-deps/setup.sh
  export PYTHONPATH=$PWD/python REFPOOL_TORCH_HOOKS_DIR=${REFPOOL_TORCH_HOOKS_DIR:-/tmp/refpool-hooks}
  export REFPOOL_LIBRARY=${REFPOOL_LIBRARY:-/tmp/b/python/librefpool.so}
  [ -f "$REFPOOL_LIBRARY" ] || { BUILD_DIR=/tmp/b; build=/tmp/b; source bench/h200/torch_build.sh; }
  # After the build: on a fresh machine the library is made just above.
  [ -n "${PROBE:-}" ] && timeout 60 python3 bench/h200/memory_stats_probe.py 2>&1 | tail -60
  left=$((${TOTAL:-470} - (SECONDS - start)))
  echo "== refpool's own tests, $left s left"
  (cd test/python &&
    timeout "$left" python3 -m pytest -q -p no:cacheprovider test_torch.py \
      -k "${OWN_TESTS:-graph_pool or graphs_replay or reduce_overhead or snapshot or mem_pool or recaptured or caching_allocator}" 2>&1 | tail -30
    [ "${CUPY:-1}" = 0 ] || timeout 120 python3 -m pytest -q -p no:cacheprovider test_cupy.py 2>&1 | tail -12
  ) | tee "$out/own-tests.txt"
fi
echo "== done in $((SECONDS - start)) s"
