# What abi/update.sh and .ci/steps/abi.sh share (sourced): where a build's librefpool is, its
# soname, and how its ABI is written (abidw from Debian's abigail-tools). The ABI is that of
# librefpool's exported functions and variables and the types they reach, declared under
# include/refpool; libstdc++'s and fmt's own types are left out (abi/suppressions.txt), so the file
# stays small and a change of theirs is not taken for one of refpool's.

abi_dir=$(dirname "${BASH_SOURCE[0]}")

# abi_library BUILD_DIR: the path of BUILD_DIR's shared librefpool (the real file, not a link).
abi_library() {
  find "$1/lib" -maxdepth 1 -type f -name 'librefpool.so.*' 2>/dev/null | sort -V | tail -n 1
}

# abi_soname LIBRARY: its DT_SONAME ("librefpool.so.2").
abi_soname() {
  readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'
}

# abi_dump LIBRARY OUT: writes LIBRARY's ABI to OUT.
abi_dump() {
  abidw --headers-dir "$abi_dir/../include/refpool" --suppressions "$abi_dir/suppressions.txt" \
    --exported-interfaces-only --drop-private-types --drop-undefined-syms --no-show-locs --no-comp-dir-path \
    --no-corpus-path --no-parameter-names --type-id-style hash --out-file "$2" "$1"
}
