#!/bin/sh
# Usage: test/fuzz/broken/check.sh [SCRATCH] [PATCH...]. Shows that the fuzzer catches each
# deliberately broken variant (test/fuzz/broken/*.patch, one bug each, or the PATCHes given;
# docs/design.md lists them).
# In a scratch copy of the committed tree (SCRATCH, default build-broken/ under the repository)
# it applies one patch at a time, rebuilds the corpus replay and runs it on the corpus plus 500
# pseudo-random inputs, as test 'fuzz-corpus' does: each variant must end in a MISMATCH or a
# crash. The replay is built with ASan and UBSan: the lifetime variants free memory another
# thread still uses, which a plain build may not notice (or notices as a hang, spinning on a lock
# in freed memory), and ASan reports at the first touch. A run over 10 minutes counts as a hang.
# Not part of CI (a rebuild per variant); run it after changing lib/plan, the lifetimes or the model.
set -u
top=$(git rev-parse --show-toplevel)
scratch=${1:-$top/build-broken}
[ $# -gt 0 ] && shift
src=$scratch/src
build=$scratch/build-asan
if [ ! -d "$src" ]; then
  git -C "$top" worktree add --detach "$src" HEAD >/dev/null || exit 1
else
  git -C "$src" checkout -q --detach "$(git -C "$top" rev-parse HEAD)" && git -C "$src" checkout -q -- . || exit 1
fi
[ -d "$build" ] || meson setup "$build" "$src" -Db_sanitize=address,undefined -Db_lundef=false -Dbenchmarks=disabled \
  -Ddemo=disabled -Dcuda=disabled -Doptimization=1 >/dev/null || exit 1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
status=0
[ $# -gt 0 ] || set -- "$top"/test/fuzz/broken/*.patch
for patch in "$@"; do
  name=$(basename "$patch" .patch)
  patch -s -d "$src" -p1 < "$patch" || { echo "$name: does not apply"; status=1; continue; }
  if ninja -C "$build" test/fuzz/refpool_fuzz_replay >"$scratch/$name.build.log" 2>&1; then
    timeout 600 "$build/test/fuzz/refpool_fuzz_replay" "$src/test/fuzz/corpus" --random 500 >"$scratch/$name.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
      echo "$name: NOT CAUGHT"
      status=1
    elif [ "$rc" -eq 124 ]; then
      echo "$name: caught: a hang (no result in 10 minutes)"
    else
      what=$(grep -A1 'MISMATCH' "$scratch/$name.log" | tail -n 1)
      [ -n "$what" ] || what=$(grep -m1 -E 'ERROR: AddressSanitizer|runtime error|SUMMARY' "$scratch/$name.log")
      [ -n "$what" ] || what=$(tail -n 1 "$scratch/$name.log")
      echo "$name: caught: $(echo "$what" | sed 's/^ *//' | cut -c1-150)"
    fi
  else
    echo "$name: does not build (see $scratch/$name.build.log)"
    status=1
  fi
  patch -s -R -d "$src" -p1 < "$patch"
done
exit $status
