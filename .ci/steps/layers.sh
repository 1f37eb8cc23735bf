# Layering (lib/check_layers.py; docs/design.md, "The owner model and where the code lives"): no
# #include of lib/ runs back up its floors except the public-header pairings the script lists, and
# no room defines members of a class another room declares. One test in the tally, 'lib-layers';
# under a second, no build. Sourced by .ci/run: appends to its `logs` array.

layers_dir=build-ci-layers
rm -rf "$layers_dir" && mkdir -p "$layers_dir"
layers_result=FAIL
python3 lib/check_layers.py >"$layers_dir/check_layers.log" 2>&1 && layers_result=OK
echo "lib-layers: $layers_result ($(head -1 "$layers_dir/check_layers.log"))"
[ "$layers_result" = OK ] || cat "$layers_dir/check_layers.log"
python3 - "$layers_dir/check_layers.log" "$layers_result" >"$layers_dir/testlog.json" <<'PY'
import json, sys
output = open(sys.argv[1], encoding="utf-8").read()
print(json.dumps({"name": "lib-layers", "result": sys.argv[2], "stdout": output}))
PY
logs+=("$PWD/$layers_dir/testlog.json")
