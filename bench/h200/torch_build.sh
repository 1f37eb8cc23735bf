# Sourced by bench/h200/torch_tests.sh and torch_features.sh (bash), after they set `out` (results
# folder) and `build` (librefpool's build folder): the environment, machine.txt, then librefpool
# (meson; skipped when REFPOOL_LIBRARY names one) and refpool's PyTorch hooks and history library
# (torch_build.py, which needs no librefpool) built side by side. Leaves lib_rc and hooks_rc (0:
# built), exports REFPOOL_LIBRARY, and says what did not build with the compiler's first errors.
# shellcheck shell=bash disable=SC2154  # out, build and start: set by the script that sources this
# shellcheck source=/dev/null
[ -f .device-deps/setup.sh ] && source .device-deps/setup.sh
export PYTHONUNBUFFERED=1 REFPOOL_TORCH_HOOKS_DIR=${REFPOOL_TORCH_HOOKS_DIR:-/tmp/refpool-hooks}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch-extensions}
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
if [ "$lib_rc" -ne 0 ]; then
  echo "== librefpool did NOT build; its first errors:"
  grep -m 12 -E "error|Error|FAILED" "$out/build-lib.txt" || tail -12 "$out/build-lib.txt"
elif [ "$hooks_rc" -ne 0 ]; then
  echo "== refpool's PyTorch hooks did NOT build (the compiler's errors above)"
fi
