#!/usr/bin/env bash
# On the H200 machine (device tool), issue 37: which earlier test of PyTorch's test_cuda.py leaves
# refpool in a state where TestCuda::test_memory_stats fails (2 MiB more reserved after a 1 KiB
# tensor is freed and empty_cache runs; it passes alone, bench/h200/memory_stats_probe.py). Runs
# test_memory_stats alone, then after each test that precedes it in one process, each pair in a
# pytest process of its own (4 at a time), and prints which pairs fail. About 2-3 minutes.
#   run: bash bench/h200/memory_stats_bisect.sh      carry: .ptests .device-deps
# PRED (a pytest -k expression) replaces the default list of predecessors.
set -uo pipefail
start=$SECONDS
out=${OUT:-h200-out}; mkdir -p "$out"
build=${BUILD_DIR:-/tmp/b}
# shellcheck source=bench/h200/torch_build.sh
source bench/h200/torch_build.sh
[ "$lib_rc" -eq 0 ] && [ "$hooks_rc" -eq 0 ] || { echo "== build failed"; exit 1; }
export PYTHONPATH=$PWD/bench/h200:$PYTHONPATH REFPOOL_PTESTS_MODE=refpool
target="TestCuda and test_memory_stats and not generators"
# The tests that run before it in one process (PyTorch's order), by class and name.
mapfile -t preds < <(python3 -m pytest .ptests/test_cuda.py -p ptests_plugin -p no:cacheprovider -q \
  --collect-only -k "${PRED:-TestCuda and not test_memory_stats}" 2>/dev/null | grep '::' | sed 's/.*:://' |
  LC_ALL=C sort -u | awk '$0 < "test_memory_stats"')  # unittest's order: by name
pair() {  # $1: a predecessor's name, or "" for the target alone
  local k="$target"; [ -n "$1" ] && k="($target) or (TestCuda and $1)"
  if timeout 120 python3 -m pytest .ptests/test_cuda.py -p ptests_plugin -p no:cacheprovider -q -p no:randomly \
      -k "$k" >"$out/bisect-${1:-alone}.txt" 2>&1; then echo "pass ${1:-alone}"
  else echo "FAIL ${1:-alone}: $(grep -m1 -E '^E +(Expected|Assertion)' "$out/bisect-${1:-alone}.txt")"; fi
}
export -f pair; export target out
echo "== ${#preds[@]} predecessors"
{ echo ""; printf '%s\n' "${preds[@]}"; } | xargs -P 4 -I{} bash -c 'pair "{}"' | sort | tee "$out/bisect.txt"
(cd "$out" && tar czf bisect-logs.tgz bisect-*.txt 2>/dev/null && rm -f bisect-*.txt; true)
echo "== done in $((SECONDS - start)) s"
