#!/bin/sh
# Usage: asan_overflow.sh PROGRAM. Passes when the overflow goes unseen with caching and is
# reported by ASan with REFPOOL_NO_CACHING=1.
set -u
program=$1
out=$("$program" 2>&1) || { echo "cached run failed:"; echo "$out"; exit 1; }
out=$(REFPOOL_NO_CACHING=1 "$program" 2>&1) && { echo "bypass run was not stopped by ASan:"; echo "$out"; exit 1; }
echo "$out" | grep -q "heap-buffer-overflow" || { echo "no heap-buffer-overflow report:"; echo "$out"; exit 1; }
echo "ASan reported the overflow under REFPOOL_NO_CACHING=1"
