# Exported symbols (lib/exported_symbols.txt): the librefpool of the plain build exports exactly
# the committed list, and no test tooling (fault injection, kernel modules, code-object parsing,
# heap checks: test/support/), whatever the list says. One test in the tally, 'exported-symbols';
# on a difference it prints the diff and how to regenerate the list after a deliberate change.
# Sourced by .ci/run: appends to its `logs` array.

sym_dir=build-ci-symbols
rm -rf "$sym_dir" && mkdir -p "$sym_dir"
sym_result=FAIL
if lib/exported_symbols.sh build-ci-plain/lib/librefpool.so >"$sym_dir/exported.txt"; then
  diff -u lib/exported_symbols.txt "$sym_dir/exported.txt" >"$sym_dir/diff.txt"
  grep -E 'fault_schedule|failing_(resource|virtual_memory)|_module|module_function|launch|code_object|check_segments|segment_heap::(check|ranges|commits)' \
    "$sym_dir/exported.txt" >"$sym_dir/test_tooling.txt"
  [ -s "$sym_dir/diff.txt" ] || [ -s "$sym_dir/test_tooling.txt" ] || sym_result=OK
fi
echo "exported-symbols: $sym_result ($(wc -l <"$sym_dir/exported.txt") exported, $(wc -l <"$sym_dir/test_tooling.txt") of them test tooling)"
if [ "$sym_result" != OK ]; then
  cat "$sym_dir/test_tooling.txt" "$sym_dir/diff.txt"
  echo "after a deliberate change of the exported API: lib/exported_symbols.sh build/lib/librefpool.so > lib/exported_symbols.txt"
fi
printf '{"name": "exported-symbols", "result": "%s"}\n' "$sym_result" >"$sym_dir/testlog.json"
logs+=("$PWD/$sym_dir/testlog.json")
