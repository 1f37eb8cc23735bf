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
# shellcheck source=/dev/null
[ -f .device-deps/setup.sh ] && source .device-deps/setup.sh
export PYTHONUNBUFFERED=1 REFPOOL_TORCH_HOOKS_DIR=${REFPOOL_TORCH_HOOKS_DIR:-/tmp/refpool-hooks}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tail -1
  git log -1 --format='commit %H %s' 2>/dev/null; cat COMMIT 2>/dev/null; } | tee "$out/machine.txt"

reconfigure=(); [ -d "$build/meson-private" ] && reconfigure=(--reconfigure)
if [ -n "${REFPOOL_LIBRARY:-}" ] && [ -f "$REFPOOL_LIBRARY" ]; then  # given (carried, or built already)
  REFPOOL_LIBRARY=$(readlink -f "$REFPOOL_LIBRARY"); export REFPOOL_LIBRARY
  echo "librefpool given: $REFPOOL_LIBRARY" >"$out/build-lib.txt" &
else
  export REFPOOL_LIBRARY=$build/python/librefpool.so
  ( timeout 300 meson setup "${reconfigure[@]}" "$build" --buildtype=release -Db_ndebug=true -Dtests=disabled \
      -Dbenchmarks=disabled -Ddemo=disabled && timeout 300 ninja -C "$build" python/librefpool.so ) \
    >"$out/build-lib.txt" 2>&1 &
fi
lib_job=$!
timeout 300 python3 bench/h200/torch_build.py --status "$out/build-status.txt" >"$out/build-hooks.txt" 2>&1 &
hooks_job=$!
wait $lib_job; lib_rc=$?
wait $hooks_job; hooks_rc=$?
echo "== builds done at $((SECONDS - start)) s (librefpool: exit $lib_rc, hooks: exit $hooks_rc)"
cat "$out/build-hooks.txt"
could_not=()
if [ "$lib_rc" -ne 0 ]; then
  echo "== librefpool did NOT build; first errors:"
  grep -m 12 -E "error|Error|FAILED" "$out/build-lib.txt" || tail -12 "$out/build-lib.txt"
  could_not+=("everything that uses refpool: librefpool did not build")
elif [ "$hooks_rc" -ne 0 ]; then
  echo "== refpool's PyTorch hooks did NOT build (errors above): what needs install() fails with that error"
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
