#!/usr/bin/env bash
# On a GPU machine (device tool): bench/h200/torch_capture.py, PyTorch's two capture tests that
# failed under refpool (test_cuda_graph_error_options, test_graph_capture_reset_recapture), with
# PyTorch's allocator and with refpool installed (segments on and off), each mode in a fresh
# process. carry: .device-deps. Builds librefpool and the hooks first (torch_build.sh); at most
# TOTAL seconds (default 115).
#   bash bench/h200/torch_capture.sh
# Expected: "OK error_options", "OK reset_recapture" and "process usable" in every mode. Before the
# fix refpool's mode printed "FAIL error_options: capture_error_mode=relaxed: the capture failed"
# (the other thread's stream had joined the capture through refpool's cross-stream event wait) and
# a poisoned process ("operation not permitted when stream is capturing").
set -uo pipefail
start=$SECONDS
total=${TOTAL:-115}
out=${OUT:-h200-out}; mkdir -p "$out"
build=${BUILD_DIR:-/tmp/b}
# shellcheck source=bench/h200/torch_build.sh
source bench/h200/torch_build.sh
for conf in torch - segments:off; do
  left=$((total - (SECONDS - start)))
  if [ "$left" -lt 10 ]; then echo "== skipped (time): conf $conf"; continue; fi
  echo "== conf $conf"
  timeout "$left" python3 bench/h200/torch_capture.py "$conf" 2>&1 | grep -vE "Warning|warn" | tail -12
done
echo "== done in $((SECONDS - start)) s"
