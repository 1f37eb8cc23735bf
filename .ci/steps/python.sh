# The Python package installed as users install it (docs/frameworks.md): pip install
# --no-build-isolation . into a fresh venv that sees Debian's meson-python, no network; then, from
# another folder and without REFPOOL_LIBRARY or PYTHONPATH, the package's host tests run against the
# installed copy. (The build-tree tests run in the main suites, suite python.) Each stage is one
# test in the tally. Sourced by .ci/run: uses as_root and appends to its `logs` array.

as_root apt-get install -y -q python3-venv python3-pip python3-mesonpy python3-pytest python3-matplotlib || exit 1
py_dir=$PWD/build-ci-python
rm -rf "$py_dir" && mkdir -p "$py_dir"
py_log=$py_dir/testlog.json
py_result() {  # py_result NAME STATUS LOGFILE
  local result=FAIL
  [ "$2" = 0 ] && result=OK
  echo "$1: $result"
  [ "$result" = OK ] || tail -n 40 "$3"
  printf '{"name": "%s", "result": "%s"}\n' "$1" "$result" >>"$py_log"
}
/usr/bin/python3 -m venv --system-site-packages "$py_dir/venv" >"$py_dir/install.log" 2>&1 &&
  "$py_dir/venv/bin/pip" install --no-build-isolation --no-index . >>"$py_dir/install.log" 2>&1
py_result python-pip-install $? "$py_dir/install.log"
# The package carries its own librefpool; the C library's headers, pkg-config file and soname
# stay out of the environment it is installed into.
strays=$(find "$py_dir/venv" \( -path '*/include/refpool*' -o -name 'refpool.pc' -o -name 'librefpool.so.*' \) 2>/dev/null)
echo "$strays" >"$py_dir/contents.log"
# Every module of python/refpool/ is installed (meson.build lists them by hand).
installed=$(dirname "$(find "$py_dir/venv" -path '*/refpool/librefpool.so' | head -n 1)")
for source in python/refpool/*.py python/refpool/*.cpp; do
  [ -f "$installed/$(basename "$source")" ] || echo "not installed: $source" >>"$py_dir/contents.log"
done
[ -z "$strays" ] && [ -n "$(find "$py_dir/venv" -path '*/refpool/librefpool.so')" ] && ! grep -q "not installed" "$py_dir/contents.log"
py_result python-package-contents $? "$py_dir/contents.log"
(cd "$py_dir" && env -u REFPOOL_LIBRARY -u PYTHONPATH "$py_dir/venv/bin/python" -m pytest -v -p no:cacheprovider \
  "$OLDPWD"/test/python/test_{core,arguments,options,steps,entry_points,plot,buffer}.py) >"$py_dir/pytest.log" 2>&1
py_result python-installed-package $? "$py_dir/pytest.log"
logs+=("$py_log")
