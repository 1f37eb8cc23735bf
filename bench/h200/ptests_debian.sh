#!/usr/bin/env bash
# Recreates .ptests/ (PyTorch's own allocator tests, docs/frameworks.md "PyTorch's own tests") from
# Debian's PyTorch source package, for a machine that reaches Debian's archive but not GitHub.
# Debian's archive lags PyTorch: trixie has 2.6.0, whose tests call a few private functions that
# 2.8 renamed (docs/frameworks.md says which results that changes). A PyTorch checkout or git
# directory of the release on the GPU machine is better where one can be had (ptests_extract.py).
#   bash bench/h200/ptests_debian.sh            VERSION=2.6.0+dfsg (the orig tarball's version)
set -euo pipefail
version=${VERSION:-2.6.0+dfsg}
out=${OUT:-.ptests}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tarball=pytorch_${version}.orig.tar.xz
curl -fsS --retry 3 -o "$work/$tarball" "http://deb.debian.org/debian/pool/main/p/pytorch/${tarball/+/%2B}"
# Only the tests: the whole tree is ten times larger.
tar -xJf "$work/$tarball" -C "$work" --wildcards '*/test/*'
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
python3 bench/h200/ptests_extract.py --src "$src" --out "$out"
echo "debian: $tarball sha256 $(sha256sum "$work/$tarball" | cut -d' ' -f1)" >>"$out/SOURCE.txt"
