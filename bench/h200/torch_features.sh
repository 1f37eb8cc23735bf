#!/usr/bin/env bash
# On the H200 machine (device tool): refpool's PyTorch features (issues 26 and 37) in one call.
# Builds the Python package's library and refpool's PyTorch hooks (and history library) side by
# side, runs the GPT-2 decode-graph benchmark (own vs refpool, side by side), then the PyTorch
# tests and the host Python tests. Each part logs to its own file under $OUT;
# PART=bench|tests|cupy|all (default all, cupy only when named); TESTS=pytest -k filter.
#   run: bash bench/h200/torch_features.sh      carry: .device-deps
# One shot within TOTAL seconds (default 450 of the device's 480 a command): each part gets a
# share of what is left. What fails to build is said (the compiler's first errors) and the parts
# that do not need it still run: without the hooks, the benchmark's refpool mode and the tests
# that install() refpool fail at once with the hooks' build error (the failure is remembered, not
# compiled again), and the summary says so; without librefpool only the PyTorch-only parts run.
# BUILD_DIR: librefpool's build folder (default /tmp/b); REFPOOL_LIBRARY: a librefpool.so to use
# instead of building one.
set -uo pipefail
start=$SECONDS
total=${TOTAL:-450}
out=${OUT:-h200-out}; mkdir -p "$out"
build=${BUILD_DIR:-/tmp/b}
# shellcheck source=bench/h200/torch_build.sh
source bench/h200/torch_build.sh
could_not=()
if [ "$lib_rc" -ne 0 ]; then
  could_not+=("everything that uses refpool: librefpool did not build")
elif [ "$hooks_rc" -ne 0 ]; then
  could_not+=("the benchmark's refpool mode and the tests that install() refpool: the hooks did not build")
fi

left() { echo $((total - (SECONDS - start) - 10)); }
part=${PART:-all}
case " $part " in *" cupy "*)
  if [ "$lib_rc" -eq 0 ]; then
    timeout "$(( $(left) / 3 ))" python3 bench/frameworks/cupy_small_batches.py --rounds "${ROUNDS:-2}" \
      --out "$out/cupy_small_batches.json" >"$out/cupy_small_batches.txt" 2>&1
    tail -8 "$out/cupy_small_batches.txt"
  else could_not+=("cupy: librefpool did not build"); fi;;
esac
if [ "$part" = all ] || [[ " $part " == *" bench "* ]]; then
  if [ "$lib_rc" -eq 0 ]; then
    seconds=$(( $(left) * 2 / 7 )); [ "$seconds" -gt 120 ] && seconds=120
    timeout "$seconds" python3 bench/frameworks/gpt2_decode_graphs.py --rounds "${ROUNDS:-2}" \
      --out "$out/gpt2_decode_graphs.json" >"$out/gpt2_decode_graphs.txt" 2>&1 ||
      echo "== the decode-graph benchmark ended with exit $? (its log: gpt2_decode_graphs.txt)"
    tail -12 "$out/gpt2_decode_graphs.txt"
  else could_not+=("the decode-graph benchmark: librefpool did not build"); fi
fi
if [ "$part" = all ] || [[ " $part " == *" tests "* ]]; then
  files=(test/python/test_arguments.py test/python/test_entry_points.py test/python/test_torch.py)
  [ "$lib_rc" -eq 0 ] || files=()
  if [ ${#files[@]} -gt 0 ]; then
    timeout "$(left)" python3 -m pytest -v -rs -s -p no:cacheprovider ${TESTS:+-k "$TESTS"} "${files[@]}" \
      >"$out/tests.txt" 2>&1
    grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$out/tests.txt" | grep -v "test_arguments.py::" | tail -40
  else could_not+=("the Python tests: librefpool did not build"); fi
fi
if [ ${#could_not[@]} -gt 0 ]; then
  echo "== could not run:"
  printf '   - %s\n' "${could_not[@]}" | tee "$out/could_not_run.txt"
fi
echo "== done in $((SECONDS - start)) s"
