#!/usr/bin/env bash
# The symbols a built librefpool exports, demangled, one a line, sorted: what lib/exported_symbols.txt
# lists and CI compares (.ci/steps/symbols.sh). After a deliberate change of the exported API:
#   lib/exported_symbols.sh build/lib/librefpool.so > lib/exported_symbols.txt
set -euo pipefail
library=${1:?usage: lib/exported_symbols.sh path/to/librefpool.so}
# Defined dynamic symbols only (what a program can link against); the undefined ones are imports.
nm -D --defined-only --demangle "$library" | awk '{ $1 = ""; $2 = ""; sub(/^  /, ""); print }' | LC_ALL=C sort -u
