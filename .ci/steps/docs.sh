# Documentation references (docs/check_refs.py): every link, anchor, section reference and repository
# path in README.md, CHANGELOG.md and docs/ resolves, and reference pages carry no commit hash, date or
# session log (history goes to docs/log/). One test in the tally; under a second, no build.
# (The examples of the docs are compiled and run by the main suites: test/docs, suite docs.)
# Sourced by .ci/run: appends to its `logs` array.

docs_dir=build-ci-docs
rm -rf "$docs_dir" && mkdir -p "$docs_dir"
docs_result=FAIL
python3 docs/check_refs.py >"$docs_dir/check_refs.log" 2>&1 && docs_result=OK
echo "docs-references: $docs_result"
[ "$docs_result" = OK ] || cat "$docs_dir/check_refs.log"
python3 - "$docs_dir/check_refs.log" "$docs_result" >"$docs_dir/testlog.json" <<'PY'
import json, sys
output = open(sys.argv[1], encoding="utf-8").read()
print(json.dumps({"name": "docs-references", "result": sys.argv[2], "stdout": output}))
PY
logs+=("$docs_dir/testlog.json")
