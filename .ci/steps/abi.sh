# ABI (include/refpool/refpool.h, "Structs that grow"): librefpool of the plain build, built above,
# against abi/<its soname>.abi.xz, the last release's ABI (abi/update.sh writes it; xz-compressed, as
# bench/traces are: the XML is 170 KB, compressed 15 KB). An incompatible
# change (a function or variable removed, a type whose size or layout changed, a signature changed)
# while the soname stays is a failure; additions are fine. A new soname needs its baseline committed.
# Builds nothing. One test in the tally. Sourced by .ci/run: uses as_root and appends to `logs`.

as_root apt-get install -y -q abigail-tools xz-utils || exit 1
abi_out=build-ci-abi
rm -rf "$abi_out" && mkdir -p "$abi_out"
abi_log=$abi_out/testlog.json
# shellcheck source=abi/abi_dump.sh
source abi/abi_dump.sh
abi_check() {
  local library soname baseline
  library=$(abi_library build-ci-plain)
  [ -n "$library" ] || { echo "no librefpool.so.* in build-ci-plain/lib"; return 1; }
  soname=$(abi_soname "$library")
  baseline=abi/$soname.abi.xz
  if [ ! -f "$baseline" ]; then
    echo "$library has soname $soname, but there is no $baseline: a new soname needs its baseline (run" \
      "abi/update.sh and commit the file)"
    return 1
  fi
  abi_dump "$library" "$abi_out/current.abi" || return 1
  xz -dc "$baseline" >"$abi_out/baseline.abi" || return 1
  # Exit status: bit 4 any change reported, bit 8 an incompatible one; with additions not reported,
  # whatever is left is a change the baseline's users would notice.
  abidiff --no-added-syms --suppressions abi/suppressions.txt "$abi_out/baseline.abi" "$abi_out/current.abi" \
    >"$abi_out/abidiff.txt" 2>&1
  local status=$?
  cat "$abi_out/abidiff.txt"
  if [ "$status" -ne 0 ]; then
    echo "librefpool's ABI differs from $baseline (abidiff status $status) while the soname is still $soname:" \
      "keep the change compatible (append fields to structs that grow, add functions), or bump soversion in" \
      "lib/meson.build and run abi/update.sh"
    return 1
  fi
}
abi_result=FAIL
abi_check && abi_result=OK
echo "abi-compatible: $abi_result"
printf '{"name": "abi-compatible", "result": "%s"}\n' "$abi_result" >>"$abi_log"
logs+=("$abi_log")
