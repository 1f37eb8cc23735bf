#!/usr/bin/env python3
"""Recreates .ptests/, PyTorch's own allocator tests that bench/h200/torch_tests.sh runs
(docs/frameworks.md, "PyTorch's own tests"), from a PyTorch source: a git directory (a bare mirror
will do) or a plain checkout. Standard library only.

    python3 bench/h200/ptests_extract.py --git-dir PYTORCH.git [--ref v2.11.0] [--out .ptests]
    python3 bench/h200/ptests_extract.py --src PYTORCH_CHECKOUT [--out .ptests]

What it writes, PyTorch's code unchanged:
- test_cuda.py and test_cudagraph_trees.py, whole, and the modules they import from their own
  folder of PyTorch's tests (the wheel ships torch.testing._internal, not test/);
- SELECTION.txt: the tests that run, one pytest node id a line (file::class::def name; a
  parametrized def stands for all its instances). bench/h200/ptests_plugin.py deselects the rest;
- SOURCE.txt: the commit (or checkout) and each file's SHA-256.
Without --ref: the first of v2.11.0, release/2.11 (PyTorch on the GPU machine) that the git
directory has, else HEAD; SOURCE.txt says which.

The selection is made from the source by the rules in SELECTION_RULES, so a newer PyTorch's new
tests of the same kinds come in by themselves. Tests that start processes of their own (subprocess,
multiprocessing, sys.executable) stay out: refpool is installed in the test process only. Prints
the selected tests by class and their count."""
import argparse
import ast
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

FILES = ("test/test_cuda.py", "test/inductor/test_cudagraph_trees.py")
REFS = ("v2.11.0", "release/2.11", "origin/release/2.11", "HEAD")

# (file, class): (test names to take, names to leave out, or a body that brings a test in).
SELECTION_RULES = {
    # memory stats, out-of-memory, memory fraction, record_stream, and the CUDA graph tests that
    # look at the allocator (pools, memory stats, capture with allocations); not the host allocator
    ("test_cuda.py", "TestCuda"): (
        r"memory|oom|fraction|record_stream|caching_allocator|graph_capture|graph_(two|three)_successive"
        r"|graph_concurrent_replay|cuda_graph_error_options|cuda_graph_allocator|same_pool",
        r"pinned|host|memory_accessing", None),
    # snapshots, history, memory_viz, allocator settings, out-of-memory
    ("test_cuda.py", "TestCudaMallocAsync"): (
        r"^test_(memory_|cpp_memory|cycles|max_split|garbage_collect|allocator|cachingAllocator"
        r"|raises_oom|notifies_oom)", None, None),
    ("test_cuda.py", "TestBlockStateAbsorption"): (r"", None, None),
    ("test_cuda.py", "TestMemPool"): (r"", None, None),
    # graph trees' checkpoint and recording tests
    ("test_cudagraph_trees.py", "CudaGraphTreeTests"): (
        r"checkpoint|recording|^test_forward_backward$", None, r"self\.num_checkpoints\(\)"),
}


class Source:
    """PyTorch's files from a git directory at one commit, or from a plain checkout."""

    def __init__(self, git_dir=None, ref=None, src=None):
        self.git_dir, self.src = git_dir, src
        if git_dir:
            self.ref = ref or next((r for r in REFS if self._commit(r)), None)
            self.commit = self._commit(self.ref) if self.ref else None
            if not self.commit:
                sys.exit(f"{git_dir}: no commit for {ref or ' / '.join(REFS)}")

    def _git(self, *args):
        return subprocess.run(["git", f"--git-dir={self.git_dir}", *args], capture_output=True)

    def _commit(self, ref):
        found = self._git("rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
        return found.stdout.decode().strip() if found.returncode == 0 else None

    def read(self, path):
        """The file's bytes, or None where the source has no such file."""
        if self.src:
            file = Path(self.src) / path
            return file.read_bytes() if file.is_file() else None
        shown = self._git("show", f"{self.commit}:{path}")
        return shown.stdout if shown.returncode == 0 else None

    def describe(self):
        if self.src:
            version = self.read("version.txt")
            return f"checkout {Path(self.src).resolve()} (version.txt: {version.decode().strip() if version else '?'})"
        date = self._git("log", "-1", "--format=%cI", self.commit).stdout.decode().strip()
        return f"git {self.git_dir} ref {self.ref} commit {self.commit} ({date})"


def local_imports(text, folder, source):
    """Paths of the modules `text` imports that lie in its own folder of the source."""
    found = []
    for node in ast.walk(ast.parse(text)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            path = f"{folder}/{name.split('.')[0]}.py"
            if source.read(path) is not None:
                found.append(path)
    return found


def test_classes(tree):
    """Classes at module level, also those defined under a module-level `if` (graph trees' tests)."""
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.ClassDef):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            body[:0] = node.body + node.orelse + getattr(node, "finalbody", [])


def spawns_processes(function):
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id in ("subprocess", "multiprocessing"):
            return True
        if isinstance(node, ast.Attribute) and (node.attr in ("executable", "multiprocessing", "Popen")
                                                or node.attr.startswith("_spawn")):
            return True
    return False


def select(file_name, text):
    """{class: [(def name, parametrized)]} of the tests SELECTION_RULES takes from one file."""
    chosen = {}
    for cls in test_classes(ast.parse(text)):
        rule = SELECTION_RULES.get((file_name, cls.name))
        if rule is None:
            continue
        take, leave, body = rule
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test_"):
                continue
            wanted = re.search(take, fn.name) or (body and re.search(body, ast.get_source_segment(text, fn)))
            if wanted and not (leave and re.search(leave, fn.name)) and not spawns_processes(fn):
                parametrized = any("parametrize" in ast.unparse(d) for d in fn.decorator_list)
                chosen.setdefault(cls.name, []).append((fn.name, parametrized))
    return chosen


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--git-dir", help="PyTorch's git directory (bare is fine)")
    where.add_argument("--src", help="a PyTorch checkout or source tree")
    parser.add_argument("--ref", help="tag, branch or commit (default: " + ", ".join(REFS) + ", the first found)")
    parser.add_argument("--out", type=Path, default=Path(".ptests"))
    args = parser.parse_args(argv)
    source = Source(args.git_dir, args.ref, args.src)

    if args.out.exists():  # made by this script (or empty): made again from scratch
        if any(args.out.iterdir()) and not (args.out / "SOURCE.txt").is_file():
            sys.exit(f"{args.out} has files this script did not write; move them away first")
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)

    copied, pending, selection = {}, list(FILES), {}
    while pending:
        path = pending.pop(0)
        name = path.rsplit("/", 1)[-1]
        if name in copied:
            continue
        data = source.read(path)
        if data is None:
            sys.exit(f"{source.describe()}: no {path}")
        copied[name] = path
        (args.out / name).write_bytes(data)
        text = data.decode()
        compile(text, name, "exec")  # a file this Python cannot parse fails here, not on the GPU machine
        pending += local_imports(text, path.rsplit("/", 1)[0], source)
        if path in FILES:
            selection[name] = select(name, text)

    ids = [f"{f}::{c}::{t}" for f, classes in selection.items() for c, tests in classes.items() for t, _ in tests]
    (args.out / "SELECTION.txt").write_text(
        "# PyTorch's tests that bench/h200/torch_tests.sh runs (bench/h200/ptests_extract.py's rules);\n"
        "# bench/h200/ptests_plugin.py deselects the others. A parametrized def stands for all its instances.\n"
        + "".join(i + "\n" for i in ids))
    digests = "".join(f"{path} -> {name} sha256 {hashlib.sha256((args.out / name).read_bytes()).hexdigest()}\n"
                      for name, path in copied.items())
    (args.out / "SOURCE.txt").write_text(
        f"PyTorch's test files, unchanged, written by bench/h200/ptests_extract.py\nsource: {source.describe()}\n"
        f"{digests}selection: {len(ids)} test definitions in SELECTION.txt\n")

    print(f"{source.describe()} -> {args.out}: {', '.join(copied)}")
    for file_name, classes in selection.items():
        for cls, tests in classes.items():
            print(f"\n{file_name}::{cls}: {len(tests)}")
            print("".join(f"  {t}{' (parametrized)' if p else ''}\n" for t, p in tests), end="")
    print(f"\n{len(ids)} test definitions selected")


if __name__ == "__main__":
    main()
