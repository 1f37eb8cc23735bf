#!/usr/bin/env bash
# On the H200 machine (device tool): captures the two serving traces of bench/traces with PyTorch's
# memory history (GPT-2 small generating with a KV cache, a step per request):
#   gpt2_serving_recurring  24 distinct (batch, prompt) shapes, one request each (a replay cycles them)
#   gpt2_serving_distinct   64 requests, no shape twice
# and writes them xz-compressed under $OUT. Then, when TESTS=1, the GPU test suite of this tree.
set -uo pipefail
out=${OUT:-h200-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
if [ "${TESTS:-0}" = 1 ]; then  # build while the GPU captures
  source .device-deps/setup.sh
  export CPATH=$DEPS_PREFIX/usr/include:$CPATH
  (meson setup /tmp/b --buildtype=release -Db_ndebug=true -Dbenchmarks=disabled >/tmp/build.txt 2>&1 &&
    ninja -C /tmp/b >>/tmp/build.txt 2>&1; echo "build rc $?" >>/tmp/build.txt) &
fi
capture() {
  timeout 200 python3 bench/traces/capture_serving.py /tmp/traces "$@" 2>&1 | grep -v Warning | tail -3
}
capture --name gpt2_serving_recurring --requests 24 --shapes 24
capture --name gpt2_serving_distinct --requests 64 --shapes 0
python3 - "$out" <<'PY'
import lzma, shutil, sys, glob, os
for path in glob.glob("/tmp/traces/*"):
    name = os.path.basename(path)
    if name.endswith(".csv"):
        with open(path, "rb") as src, lzma.open(os.path.join(sys.argv[1], name + ".xz"), "wb", preset=9) as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copy(path, sys.argv[1])
    print(name, os.path.getsize(path))
PY
if [ "${TESTS:-0}" = 1 ]; then
  wait
  tail -3 /tmp/build.txt
  timeout ${TEST_SECONDS:-240} meson test -C /tmp/b --print-errorlogs --num-processes 4 >"$out/tests.txt" 2>&1
  grep -E "^ *[0-9]+/" "$out/tests.txt" | grep -vE " OK " | tail -30
  grep -E "^Ok|^Fail|^Skip|^Timeout" "$out/tests.txt"
fi
