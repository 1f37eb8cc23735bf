#!/usr/bin/env bash
# On a GPU machine (device tool): bench/h200/torch_record_stream.py in each variant, a fresh
# process each (a fault poisons the CUDA context). carry: .device-deps. About 2 minutes.
set -uo pipefail
start=$SECONDS
out=${OUT:-h200-out}; mkdir -p "$out"
build=${BUILD_DIR:-/tmp/b}
# shellcheck source=bench/h200/torch_build.sh
source bench/h200/torch_build.sh
run() {
  echo "== conf ${1} flags ${*:2}"
  timeout 40 python3 bench/h200/torch_record_stream.py "$@" 2>&1 | grep -vE "Warning|warn" | tail -3
}
run - sync_each
run - no_empty
run - no_record
run segments:off
echo "== conf - sync_each, CUDA_LAUNCH_BLOCKING=1"
CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 bench/h200/torch_record_stream.py - sync_each 2>&1 | grep -vE "Warning|warn" | tail -3
if command -v compute-sanitizer >/dev/null; then  # names the faulting kernel and address
  echo "== compute-sanitizer memcheck, conf - (first errors)"
  timeout 200 compute-sanitizer --tool memcheck --print-limit 4 python3 bench/h200/torch_record_stream.py - 2>&1 \
    | grep -vE "Warning|warn" | head -60
else
  echo "== no compute-sanitizer on PATH ($(ls -d /usr/local/cuda*/bin 2>/dev/null | tr '\n' ' '))"
fi
echo "== done in $((SECONDS - start)) s"
