#!/bin/sh
# Usage: test/fuzz/broken/check.sh [SCRATCH]. Shows that the fuzzer catches each deliberately
# broken variant of lib/plan and lib/segments (test/fuzz/broken/*.patch, one bug each;
# docs/design.md lists them).
# In a scratch copy of the committed tree (SCRATCH, default build-broken/ under the repository)
# it applies one patch at a time, rebuilds the corpus replay and runs it on the corpus plus 500
# pseudo-random inputs, as test 'fuzz-corpus' does (with MALLOC_PERTURB_, so that memory a broken
# variant frees too early is overwritten and a use of it shows): each variant must end in a
# MISMATCH (or a crash). Not part of CI (a rebuild per variant); run it after changing lib/plan or the model.
set -u
top=$(git rev-parse --show-toplevel)
scratch=${1:-$top/build-broken}
src=$scratch/src
if [ ! -d "$src" ]; then
  git -C "$top" worktree add --detach "$src" HEAD >/dev/null || exit 1
else
  git -C "$src" checkout -q --detach "$(git -C "$top" rev-parse HEAD)" && git -C "$src" checkout -q -- . || exit 1
fi
[ -d "$scratch/build" ] || meson setup "$scratch/build" "$src" -Dbenchmarks=disabled -Ddemo=disabled >/dev/null || exit 1
status=0
for patch in "$top"/test/fuzz/broken/*.patch; do
  name=$(basename "$patch" .patch)
  patch -s -d "$src" -p1 < "$patch" || { echo "$name: does not apply"; status=1; continue; }
  if ninja -C "$scratch/build" test/fuzz/refpool_fuzz_replay >"$scratch/$name.build.log" 2>&1; then
    if MALLOC_PERTURB_=165 "$scratch/build/test/fuzz/refpool_fuzz_replay" "$src/test/fuzz/corpus" --random 500 \
      >"$scratch/$name.log" 2>&1; then
      echo "$name: NOT CAUGHT"
      status=1
    else
      what=$(grep -A1 'MISMATCH' "$scratch/$name.log" | tail -n 1 | cut -c1-150)
      echo "$name: caught: ${what:-$(tail -n 1 "$scratch/$name.log" | cut -c1-150)}"
    fi
  else
    echo "$name: does not build (see $scratch/$name.build.log)"
    status=1
  fi
  patch -s -R -d "$src" -p1 < "$patch"
done
exit $status
