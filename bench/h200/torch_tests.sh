#!/usr/bin/env bash
# On the H200 machine (device tool): PyTorch's own allocator tests with PyTorch's allocator and with
# refpool installed, and the tests whose results differ (issue 37). The tests are PyTorch's, kept
# out of this repository: the lead extracts them into .ptests/ (ignored by git) and carries it.
# Builds the Python package's library and refpool's PyTorch hooks (and history library) once, then
# bench/h200/torch_tests.py runs every test file in each mode in pytest processes of their own.
#   run: bash bench/h200/torch_tests.sh      carry: .ptests .device-deps
#   BUDGET (seconds for the pytest runs, default 330: the build takes the rest of 8 minutes), TESTS
#   (pytest -k filter), FILES (test_cuda.py,test_cudagraph_trees.py by default), OUT (results folder)
set -uo pipefail
out=${OUT:-h200-out}; mkdir -p "$out"
[ -f .device-deps/setup.sh ] && source .device-deps/setup.sh
export PYTHONUNBUFFERED=1 REFPOOL_TORCH_HOOKS_DIR=/tmp/refpool-hooks TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
tests=${PTESTS:-.ptests}
[ -f "$tests/test_cuda.py" ] || { echo "no $tests/test_cuda.py: carry .ptests (docs/frameworks.md)"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/machine.txt"
git log -1 --format='commit %H %s' 2>/dev/null | tee -a "$out/machine.txt" || true
start=$SECONDS
[ -d /tmp/b/meson-private ] && reconfigure=--reconfigure || reconfigure=
{ meson setup $reconfigure /tmp/b --buildtype=release -Db_ndebug=true -Dtests=disabled -Dbenchmarks=disabled -Ddemo=disabled &&
  ninja -C /tmp/b python/librefpool.so; } >"$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; exit 1; }
export REFPOOL_LIBRARY=/tmp/b/python/librefpool.so PYTHONPATH=$PWD/python
python3 -W always -c "import torch; from refpool import _torch_hooks as h; print(h.load(torch)[0]); print(h.load_history(torch))" \
  >>"$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
echo "library and hooks built in $((SECONDS - start)) s"; tail -2 "$out/build.txt"
python3 bench/h200/torch_tests.py --tests "$tests" --out "$out" --budget "${BUDGET:-330}" ${TESTS:+-k "$TESTS"} \
  ${FILES:+--files "$FILES"}
# The device tool brings back a few files: the table, the JSON and machine.txt stay, the logs go
# into one archive.
(cd "$out" && tar czf logs.tgz build.txt pytest-*.txt results-*.jsonl 2>/dev/null &&
  rm -f build.txt pytest-*.txt results-*.jsonl)
