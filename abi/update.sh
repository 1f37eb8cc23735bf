#!/usr/bin/env bash
# Writes abi/<soname>.abi.xz, the ABI .ci/steps/abi.sh compares each build's librefpool against, from a
# built library. Run it when a release is made (the file is the last release's ABI) and when the
# soname is bumped for an intended incompatible change (lib/meson.build's soversion), then commit
# the file; delete the previous soname's file then.
# Usage: abi/update.sh [BUILD_DIR]   (default: build-ci-plain, else build; a default build, as CI's)
set -euo pipefail
cd "$(dirname "$0")/.."
source abi/abi_dump.sh
build=${1:-}
if [ -z "$build" ]; then
  build=build-ci-plain
  [ -d "$build" ] || build=build
fi
library=$(abi_library "$build")
[ -n "$library" ] || { echo "abi/update.sh: no librefpool.so.* in $build/lib: build it first" >&2; exit 1; }
soname=$(abi_soname "$library")
abi_dump "$library" "abi/$soname.abi"
xz -9 -f "abi/$soname.abi"  # xz-compressed, as bench/traces are: .ci/steps/abi.sh reads it with xz -dc
echo "abi/$soname.abi.xz written from $library"
