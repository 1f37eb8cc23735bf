#!/usr/bin/env bash
# On the H200 machine (device tool): PyTorch's own allocator tests with PyTorch's allocator and with
# refpool installed, and the tests whose results differ (issue 37). The tests are PyTorch's, kept
# out of this repository: bench/h200/ptests_extract.py writes them into .ptests/ (ignored by git).
#   run: bash bench/h200/torch_tests.sh      carry: .ptests .device-deps
# One shot within TOTAL seconds (default 450 of the device's 480 a command): librefpool and
# refpool's PyTorch hooks (and history library) build side by side, then
# bench/h200/torch_tests.py runs every test file in each mode in pytest processes of their own, in
# the time left. What fails to build is said (the compiler's first errors) and the run goes on
# with what does not need it:
#   - the hooks did not build: refpool's mode runs with install(hooks=False), and says so;
#   - librefpool did not build: PyTorch's mode alone (the baseline), and says so.
# TESTS (pytest -k filter), FILES (test_cuda.py,test_cudagraph_trees.py by default), OUT (results
# folder), BUILD_DIR (librefpool's build folder, default /tmp/b), REFPOOL_LIBRARY (a librefpool.so
# to use instead of building one), PTESTS (tests folder, .ptests). A dry run without a GPU or
# PyTorch, on fake test files, takes the hooks-failed branch (and with a BUILD_DIR that cannot be
# made, the librefpool-failed one): PTESTS=/tmp/fake REFPOOL_LIBRARY=build/python/librefpool.so
# TOTAL=120 bash bench/h200/torch_tests.sh
set -uo pipefail
start=$SECONDS
total=${TOTAL:-450}
out=${OUT:-h200-out}; mkdir -p "$out"
build=${BUILD_DIR:-/tmp/b}
tests=${PTESTS:-.ptests}
[ -f "$tests/test_cuda.py" ] || { echo "no $tests/test_cuda.py: carry .ptests (docs/frameworks.md)"; exit 2; }
# shellcheck source=bench/h200/torch_build.sh
source bench/h200/torch_build.sh

modes=${MODES:-torch,refpool}  # MODES=refpool: refpool alone (compare with an earlier run)
note=""
if [ "$lib_rc" -ne 0 ]; then
  echo "== refpool's mode cannot run; PyTorch's mode runs alone"
  modes=torch
  note="refpool's mode did not run: librefpool did not build (build-lib.txt)"
elif [ "$hooks_rc" -ne 0 ]; then
  echo "== refpool's mode runs with install(hooks=False)"
  export REFPOOL_PTESTS_HOOKS=0
  note="refpool's mode ran with install(hooks=False): its hooks did not build (build-hooks.txt), so CUDA graph"
  note+=" pools, record_stream, torch.OutOfMemoryError, memory fraction and per-request stats were not there"
fi
grep -q "^history failed" "$out/build-status.txt" 2>/dev/null &&
  note="${note:+$note; }the memory-history library did not build (build-hooks.txt): history tests fail for that"

# Tests of another PyTorch release call private functions by their names then: which of the names
# ptests_plugin.py maps (RENAMED, old and new) this PyTorch has.
PYTHONPATH=bench/h200 python3 -c 'import torch, ptests_plugin
names = [n for pair in ptests_plugin.RENAMED.items() for n in pair]
print("torch._C has:", ", ".join(n for n in names if hasattr(torch._C, n)) or "none",
      "| lacks:", ", ".join(n for n in names if not hasattr(torch._C, n)) or "none")' 2>&1 | tail -1
budget=$((total - (SECONDS - start) - 20))  # 20 s: the table and the archive
echo "== $budget s left for the pytest runs ($modes)"
if [ "$budget" -lt 30 ]; then
  echo "== too little time left to run tests"
else
  python3 bench/h200/torch_tests.py --tests "$tests" --out "$out" --budget "$budget" --modes "$modes" \
    ${note:+--note "$note"} ${TESTS:+-k "$TESTS"} ${FILES:+--files "$FILES"}
fi
# The device tool brings back a few files: the table, the JSON, machine.txt and the build status
# stay, the logs go into one archive.
(cd "$out" && tar czf logs.tgz build-*.txt pytest-*.txt results-*.jsonl 2>/dev/null &&
  rm -f build-lib.txt build-hooks.txt pytest-*.txt results-*.jsonl)
echo "== done in $((SECONDS - start)) s"
