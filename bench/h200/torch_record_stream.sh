#!/usr/bin/env bash
# On a GPU machine (device tool): bench/h200/torch_record_stream.py in each variant, a fresh process
# each (a fault poisons the CUDA context). carry: .device-deps. At most TOTAL seconds (default 230):
# a variant that would start after LAST_START s (default 170) is skipped, and says so.
#   bash bench/h200/torch_record_stream.sh
# How to read it (issue 37): docs/frameworks.md, "PyTorch's own tests".
#   ctx_sync / decommit_waits: "OK" means refpool's device-wide wait before unmapping covers PyTorch's
#     streams; "BROKEN" names the wait that does not.
#   harness variants replay the failing pair of tests as pytest runs them (no synchronisation
#     between tests). "FAULT after randn(7, 7)" with refpool and "OK" with conf torch reproduces it;
#     the probe lines say whether the side stream still had work when empty_cache returned (idle:
#     False with segment_trims +N > 0 means memory was unmapped under it) and where randn's tensor
#     lies. sync_empty: "FAULT after empty_cache" means empty_cache freed or unmapped memory under
#     the side stream's work; no fault means that work was hit later, by the next test's requests;
#     the fault still at randn means the next test's own memory is bad. sync_loop (all work done
#     before empty_cache) tells the same from the other side. Which of no_record / no_empty /
#     segments:off makes the fault go names the path.
set -uo pipefail
start=$SECONDS
total=${TOTAL:-230}
last_start=${LAST_START:-170}
out=${OUT:-h200-out}; mkdir -p "$out"
build=${BUILD_DIR:-/tmp/b}
# shellcheck source=bench/h200/torch_build.sh
source bench/h200/torch_build.sh
run() {  # run [ENV=VALUE...] -- CONF FLAGS...
  local env=()
  while [ "$1" != "--" ]; do env+=("$1"); shift; done
  shift
  if [ $((SECONDS - start)) -gt "$last_start" ]; then echo "== skipped (time): ${env[*]} $*"; return; fi
  echo "== ${env[*]} conf $1 flags ${*:2}"
  env "${env[@]}" timeout 30 python3 bench/h200/torch_record_stream.py "$@" 2>&1 | grep -vE "Warning|warn" | tail -8
}
run -- torch ctx_sync
run -- - decommit_waits
run -- - harness probe
run -- torch harness probe
run -- - harness probe sync_empty
run -- - harness probe sync_loop
run CUDA_LAUNCH_BLOCKING=1 -- - harness probe
run -- - harness probe no_record
run -- - harness probe no_empty
run -- segments:off harness probe
run -- - probe sync_each
left=$((total - (SECONDS - start) - 5))
if command -v compute-sanitizer >/dev/null && [ "$left" -gt 30 ]; then  # names the faulting kernel and address
  echo "== compute-sanitizer memcheck, conf - harness ($left s at most; first errors)"
  timeout "$left" compute-sanitizer --tool memcheck --print-limit 4 python3 bench/h200/torch_record_stream.py - \
    harness probe 2>&1 | grep -vE "Warning|warn" | head -60
else
  echo "== no compute-sanitizer run ($left s left; on PATH: $(command -v compute-sanitizer || echo no))"
fi
echo "== done in $((SECONDS - start)) s"
