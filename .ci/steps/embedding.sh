# Embedding (docs/embedding.md): refpool as a Meson subproject of test/consumer, shared and static
# (default_library=both: one compile of refpool gives both libraries, and each program is linked
# against each), built with --werror and warning_level=3 and options set from the parent; then the
# same programs built by test/pkgconfig/Makefile with pkg-config against a `meson install
# --destdir` of the plain build. Each program run is one test in the tally. (The C API and ctypes tests run in the main suites, suite embedding.)
# Sourced by .ci/run: uses its `run` function and appends to its `logs` array.

mkdir -p test/consumer/subprojects
ln -sfn ../../.. test/consumer/subprojects/refpool  # the repository root, as the subproject
consumer_options=(--werror -Dwarning_level=3 -Dbuildtype=debugoptimized --wrap-mode=forcefallback
  -Drefpool:cuda=disabled -Drefpool:hip=disabled)
run consumer test/consumer -Ddefault_library=both "${consumer_options[@]}"

# pkg-config: install the plain build of the main suites (a shared library), else a library-only
# build of our own, into a destdir, and point pkg-config's search path and sysroot at it.
pc_dir=$PWD/build-ci-pkgconfig
rm -rf "$pc_dir" && mkdir -p "$pc_dir"
pc_log=$pc_dir/testlog.json
installed=build-ci-plain
if [ ! -f "$installed/build.ninja" ]; then
  installed=$pc_dir/build
  meson setup "$installed" -Dtests=disabled -Dbenchmarks=disabled -Ddemo=disabled >"$pc_dir/setup.log" 2>&1 &&
    meson compile -C "$installed" >>"$pc_dir/setup.log" 2>&1 || cat "$pc_dir/setup.log"
fi
phase "pkg-config consumer: meson install -C $installed --no-rebuild --destdir $pc_dir/destdir"
meson install -C "$installed" --no-rebuild --destdir "$pc_dir/destdir" >"$pc_dir/install.log" 2>&1 ||
  cat "$pc_dir/install.log"
pc_file=$(find "$pc_dir/destdir" -name refpool.pc 2>/dev/null | head -n 1)
for target in c cpp; do
  result=FAIL
  if [ -n "$pc_file" ] &&
    PKG_CONFIG_PATH=$(dirname "$pc_file") PKG_CONFIG_SYSROOT_DIR=$pc_dir/destdir \
    LD_LIBRARY_PATH=$(dirname "$(dirname "$pc_file")") \
    make -f test/pkgconfig/Makefile OUT="$pc_dir" "check-$target" >"$pc_dir/$target.log" 2>&1; then
    result=OK
  fi
  echo "pkgconfig-$target: $result"
  [ "$result" = OK ] || cat "$pc_dir/$target.log" 2>/dev/null || echo "(no refpool.pc was installed)"
  printf '{"name": "pkgconfig-%s", "result": "%s"}\n' "$target" "$result" >>"$pc_log"
done
logs+=("$pc_log")
