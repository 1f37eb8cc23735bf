#!/usr/bin/env bash
# On the H200 machine (device tool): issue 36's figures, in parts that each write their own files
# under $OUT (default ./h200-out). carry: .device-deps.
#   capture   the two serving traces with PyTorch's memory history (bench/h200/serving_traces.sh:
#             24 shapes recurring in turn, and no shape twice), written xz-compressed under $OUT
#   traces    bench/trace_replay --cuda, every row, side by side: the training traces, the serving
#             trace as 24 shapes in turn and with no shape twice, and the captured serving traces
#             (this run's when capture ran first, else bench/traces'), 1200 iterations so that the no-repeat policy's probe windows count
#   generate  GPT-2 generation with a KV cache in real PyTorch, random batch and prompt per request,
#             200 measured requests, PyTorch's allocator against refpool.torch.install(); one round
#             of each mode does not resolve 5% (three runs gave 0.960-1.045 on the median):
#             ROUNDS=2 STEPS=120 interleaves two rounds of 120 (about 1.2x the time of one of 200)
#   varlen    GPT-2 training with 13 sequence lengths in real PyTorch, the same two modes
#   fresh     the no-shape-twice rows `default` and `plain step` alone, each in its own process,
#             alternated three times (whether the `traces` part's gap between them is the row order)
# Usage: bash bench/h200/issue36.sh PART...   (all four take about 7 minutes)
set -uo pipefail
start=$SECONDS
out=${OUT:-h200-out}; mkdir -p "$out"
source .device-deps/setup.sh
export CPATH=$DEPS_PREFIX/usr/include:$CPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
torch_dir=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
build() {
  [ -d /tmp/b/meson-private ] && reconfigure=--reconfigure || reconfigure=
  meson setup $reconfigure /tmp/b --buildtype=release -Db_ndebug=true -Dbenchmarks=enabled -Dtests=disabled \
    -Dpython=enabled -Ddemo=disabled ${torch_dir:+-Dtorch_dir=$torch_dir} >"$out/build.txt" 2>&1 &&
    ninja -C /tmp/b bench/trace_replay python/librefpool.so >>"$out/build.txt" 2>&1
}
# refpool's PyTorch hooks, built beside librefpool where a part runs PyTorch: compiled at the first
# install() otherwise, inside the timed-out benchmark process (a minute or more on a fresh machine).
export REFPOOL_TORCH_HOOKS_DIR=${REFPOOL_TORCH_HOOKS_DIR:-/tmp/refpool-hooks} TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch-extensions}
hooks_job=
case " $* " in *" generate "* | *" varlen "*)
  PYTHONPATH=$PWD/python python3 bench/h200/torch_build.py --status "$out/build-status.txt" >"$out/build-hooks.txt" 2>&1 &
  hooks_job=$! ;;
esac
if [ "${1:-}" = capture ]; then  # the GPU captures while the CPUs build
  build & build_job=$!
  OUT=$out timeout 240 bash bench/h200/serving_traces.sh 2>&1 | tail -4
  wait $build_job; build_rc=$?
  shift
else
  build; build_rc=$?
fi
[ "$build_rc" = 0 ] || { echo "build failed:"; tail -30 "$out/build.txt"; exit 1; }
echo "== built at $((SECONDS - start)) s"
lib=/tmp/b/python/librefpool.so
replay() {  # replay NAME ARGS...: every row, one JSON each
  local name=$1; shift
  timeout 120 /tmp/b/bench/trace_replay --cuda --json "$out/replay_$name.json" "$@" 2>&1 | tee -a "$out/traces.txt"
}
for part in "$@"; do
  case $part in
    traces)
      replay training bench/traces/gpt.csv.xz bench/traces/gpt_varlen.csv.xz bench/traces/resnet18.csv.xz
      replay serving bench/traces/gpt2_serving.csv.xz
      replay serving_24_shapes --iterations 1200 --variants 2 --sequences 24 bench/traces/gpt2_serving.csv.xz
      replay serving_24_shapes_random --iterations 1200 --variants 2 --sequences 24 --shuffle 1 bench/traces/gpt2_serving.csv.xz
      replay serving_no_shape_twice --iterations 1200 --fresh bench/traces/gpt2_serving.csv.xz
      for name in gpt2_serving_recurring gpt2_serving_distinct; do  # this run's capture, else the kept one
        captured=$out/$name.csv.xz; [ -f "$captured" ] || captured=bench/traces/$name.csv.xz
        [ -f "$captured" ] || continue
        replay "$(basename "$captured" .csv.xz)" --iterations 1200 "$captured"
      done ;;
    fresh)
      for round in 1 2 3; do
        for row in 'plain step' default; do
          replay "fresh_${round}_${row// /_}" --iterations 1200 --fresh --only "$row" bench/traces/gpt2_serving.csv.xz | grep -v '^trace'
        done
      done ;;
    generate | varlen)
      [ -n "$hooks_job" ] && { wait "$hooks_job" || { echo "hooks did not build:"; tail -12 "$out/build-hooks.txt"; }; hooks_job=; }
      name=gpt2_generate extra=(--warmup 8 --steps "${STEPS:-200}")
      [ $part = varlen ] && name=gpt2_train_varlen extra=()
      timeout 450 python3 bench/frameworks/run_all.py --library "$lib" --rounds "${ROUNDS:-1}" --modes own,refpool \
        "${extra[@]}" --only $name --timeout 300 --out "$out/$part.json" >"$out/$part.txt" 2>&1
      tail -6 "$out/$part.txt" ;;
    *) echo "unknown part $part (capture must come first)"; exit 2 ;;
  esac
done
echo "== done in $((SECONDS - start)) s"
