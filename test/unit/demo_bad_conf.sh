#!/bin/sh
# refpool-demo with a bad REFPOOL_CONF (a typo in a key, a bad value) and a bad REFPOOL_NO_CACHING:
# exit status 2, and what to fix on stderr (the key, the values allowed, the variable), never an abort.
demo=$1
expect() {  # expect VARIABLE=VALUE TEXT...
  setting=$1
  shift
  out=$(env "$setting" "$demo" 2>&1)
  status=$?
  if [ "$status" != 2 ]; then
    echo "$setting: exit status $status, expected 2:"
    echo "$out"
    exit 1
  fi
  for part in "$@"; do
    case $out in
      *"$part"*) ;;
      *) echo "$setting: the output does not say \"$part\":"; echo "$out"; exit 1 ;;
    esac
  done
}
expect REFPOOL_CONF=rounding:exact,colour:blue "unknown key 'colour'" "rounding, max_idle_bytes" \
  "REFPOOL_CONF is 'rounding:exact,colour:blue'" "Fix the value"
expect REFPOOL_CONF=auto_plans:maybe "'auto_plans' has value 'maybe'" "allowed: on, off"
expect REFPOOL_NO_CACHING=sometimes "REFPOOL_NO_CACHING has value 'sometimes'" "REFPOOL_NO_CACHING is 'sometimes'"
echo "refpool-demo named each bad setting and exited with status 2"
