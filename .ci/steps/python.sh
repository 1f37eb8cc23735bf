# The Python package as users get it (docs/frameworks.md): a wheel built from this source by pip
# through meson-python, offline (Debian's python3-mesonpy, --no-build-isolation: CI has no PyPI),
# installed into a fresh venv; then, from another folder and without REFPOOL_LIBRARY or PYTHONPATH,
# the package's host tests run against the installed copy with that venv's Python. (The build-tree
# tests run in the main suites, suite python.) One meson-python build, as before the wheel. Each
# stage is one test in the tally. Sourced by .ci/run: uses as_root and appends to its `logs` array.

as_root apt-get install -y -q python3-venv python3-pip python3-mesonpy python3-pytest python3-matplotlib || exit 1
py_dir=$PWD/build-ci-python
rm -rf "$py_dir" && mkdir -p "$py_dir/wheels"
py_log=$py_dir/testlog.json
py_result() {  # py_result NAME STATUS LOGFILE
  local result=FAIL
  [ "$2" = 0 ] && result=OK
  echo "$1: $result"
  [ "$result" = OK ] || tail -n 40 "$3"
  printf '{"name": "%s", "result": "%s"}\n' "$1" "$result" >>"$py_log"
}
# The wheel, built by Debian's own Python (pip wheel installs nothing, so PEP 668 does not apply).
/usr/bin/python3 -m pip wheel --no-build-isolation --no-index --no-deps -w "$py_dir/wheels" . >"$py_dir/wheel.log" 2>&1
py_result python-wheel $? "$py_dir/wheel.log"
wheel=$(find "$py_dir/wheels" -name 'refpool-*.whl' | head -n 1)
# The wheel holds the package only: every module of python/refpool/ (python/meson.build lists them by
# hand) and its own librefpool.so, beside the dist-info; no headers, pkg-config file, demo or soname.
/usr/bin/python3 - "$wheel" python/refpool >"$py_dir/contents.log" 2>&1 <<'PY'
import pathlib, sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
package = {n for n in names if n.startswith("refpool/")}
strays = [n for n in names if n not in package and not n.split("/")[0].endswith(".dist-info")]
sources = {f"refpool/{p.name}" for p in pathlib.Path(sys.argv[2]).iterdir() if p.suffix in (".py", ".cpp")}
missing = sorted(sources - package) + ([] if "refpool/librefpool.so" in package else ["refpool/librefpool.so"])
print("\n".join(names))
for name in strays:
    print("not the package:", name)
for name in missing:
    print("missing:", name)
sys.exit(1 if strays or missing else 0)
PY
py_result python-wheel-contents $? "$py_dir/contents.log"
# A fresh venv (it sees Debian's pytest, NumPy and matplotlib, never this source) installs the wheel.
/usr/bin/python3 -m venv --system-site-packages "$py_dir/venv" >"$py_dir/install.log" 2>&1 &&
  "$py_dir/venv/bin/pip" install --no-index --no-deps "$wheel" >>"$py_dir/install.log" 2>&1
py_result python-wheel-install $? "$py_dir/install.log"
(cd "$py_dir" && env -u REFPOOL_LIBRARY -u PYTHONPATH "$py_dir/venv/bin/python" -m pytest -v -p no:cacheprovider \
  "$OLDPWD"/test/python/test_{core,arguments,options,steps,entry_points,plot,buffer}.py) >"$py_dir/pytest.log" 2>&1
py_result python-installed-package $? "$py_dir/pytest.log"
logs+=("$py_log")
