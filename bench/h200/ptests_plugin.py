"""pytest plugin for bench/h200/torch_tests.py (`-p ptests_plugin`): runs PyTorch's own test files in
one allocator mode, unchanged.

- REFPOOL_PTESTS_MODE=refpool: refpool.torch.install() before the test files are imported (they
  initialise CUDA at import), in every pytest process (with pytest-xdist, in each worker);
  REFPOOL_PTESTS_HOOKS=0: install(hooks=False), for a run whose hooks did not build.
- Import shims: the test files may be newer than the installed PyTorch. A name they import from
  torch.* that this PyTorch lacks is given a stand-in (False for flags, () for architecture lists,
  else a decorator that skips the test saying which name is missing), and a missing `expecttest`
  (PyTorch's test dependency) a minimal module; the tests themselves are never edited. Private
  functions an older test file calls by a name this PyTorch changed (RENAMED) get that name back
  as the function it became, in both modes alike.
- REFPOOL_PTESTS_RESULTS=PATH: each test's phases are appended there as JSON lines as they finish
  (by the controlling process), so a run stopped by its time budget keeps what it did.
- Selection: where the test file's folder has SELECTION.txt (bench/h200/ptests_extract.py writes it),
  only the tests it names run (file::class::def name; a parametrized def's instances all run), the
  rest are deselected, so the copied test files stay whole and unchanged.
- Order: tests that build TestMemPool's dummy allocator with check_vars=True run together, and
  those with check_vars=False together (first in refpool mode, which follows a torch-mode run that
  ended with them): torch.utils.cpp_extension.load_inline recompiles that extension (half a minute)
  each time its source changes, which PyTorch's alphabetical order would do four times a run."""
import ast
import importlib
import json
import os
import sys
import types
import unittest

MODE_ENV, RESULTS_ENV, HOOKS_ENV = "REFPOOL_PTESTS_MODE", "REFPOOL_PTESTS_RESULTS", "REFPOOL_PTESTS_HOOKS"
FLAG_PREFIXES = ("TEST_", "IS_", "HAS_", "PLATFORM_SUPPORTS_", "SM")


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # pytest-xdist's controller: its workers import the tests
    if os.environ.get(MODE_ENV) == "refpool":  # first: PyTorch's test helpers initialise CUDA on import
        import refpool.torch
        refpool.torch.install(hooks=os.environ.get(HOOKS_ENV, "1") != "0")
    _shim_expecttest()
    _shim_renamed()
    for path in config.args:
        if path.split("::")[0].endswith(".py") and os.path.isfile(path.split("::")[0]):
            _shim_imports(path.split("::")[0])


def pytest_collection_modifyitems(session, config, items):
    kept, dropped = _select(items)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    groups = ("check_vars=True", "check_vars=False")
    if os.environ.get(MODE_ENV) == "refpool":
        groups = groups[::-1]

    def group(item):
        try:
            import inspect
            source = inspect.getsource(getattr(item, "function", None) or item.obj)
        except (OSError, TypeError):
            return 0
        return next((i + 1 for i, text in enumerate(groups) if text in source), 0)

    items.sort(key=group)  # stable: the rest keep pytest's order


def _select(items):
    """(kept, deselected): the items SELECTION.txt beside their file names; all where there is none."""
    selections, kept, dropped = {}, [], []
    for item in items:
        folder = os.path.dirname(str(item.fspath))
        if folder not in selections:
            path = os.path.join(folder, "SELECTION.txt")
            selections[folder] = None
            if os.path.isfile(path):
                with open(path) as lines:
                    selections[folder] = {line.strip() for line in lines if line.strip() and line[0] != "#"}
        chosen = selections[folder]
        cls = getattr(item, "cls", None)
        # a parametrized test's instances keep their def's name (PyTorch wraps them with functools.wraps)
        names = {item.name, getattr(getattr(item, "obj", None), "__name__", item.name)}
        ids = {f"{os.path.basename(str(item.fspath))}::{cls.__name__ if cls else ''}::{n}" for n in names}
        (kept if chosen is None or ids & chosen else dropped).append(item)
    return kept, dropped


def pytest_report_header(config):
    hooks = "" if os.environ.get(HOOKS_ENV, "1") != "0" else " (install(hooks=False))"
    return f"allocator mode: {os.environ.get(MODE_ENV, 'torch')}{hooks}"


def pytest_runtest_logreport(report):
    _record(report, report.when)


def pytest_collectreport(report):
    if report.failed:  # a test file that cannot be imported: one error for the whole file
        _record(report, "collect")


def _record(report, when):
    path = os.environ.get(RESULTS_ENV)
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):  # the controller writes: it sees every worker's report
        return
    line = {"nodeid": report.nodeid or "(collection)", "when": when, "outcome": report.outcome,
            "xfail": hasattr(report, "wasxfail"), "duration": round(getattr(report, "duration", 0.0), 3),
            "message": _first_line(report)}
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")


def _first_line(report):
    """The failure's first line (the exception and its message), or the skip reason."""
    if report.passed and not hasattr(report, "wasxfail"):
        return ""
    if report.skipped and isinstance(report.longrepr, tuple):  # (file, line, reason)
        return str(report.longrepr[-1])[:300]
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return crash.message.splitlines()[0][:300]
    text = getattr(report, "longreprtext", "") or str(getattr(report, "longrepr", "") or "")
    errors = [line[2:].strip() for line in text.splitlines() if line.startswith("E ")]
    lines = errors or [line for line in text.splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


# ---- import shims -------------------------------------------------------------------------------

class _Missing:
    """Stands for a name this PyTorch lacks: as a decorator (or decorator factory) it skips the test."""

    def __init__(self, name):
        self.name = name

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return self._skipping(args[0])
        return self._skipping

    def _skipping(self, test):
        return unittest.skip(f"{self.name} is not in this PyTorch (bench/h200/ptests_plugin.py)")(test)


def _stand_in(module, name):
    if name == "HAS_CUDA":  # renamed HAS_CUDA_AND_TRITON in newer PyTorch
        return bool(getattr(module, "HAS_CUDA_AND_TRITON", False))
    if name.endswith("_ARCH"):
        return ()
    if name.startswith(FLAG_PREFIXES) and name.upper() == name:
        return False
    return _Missing(name)


def _shim_imports(path):
    try:
        import torch  # noqa: F401
    except ImportError:
        return  # no PyTorch: nothing to shim, the test file says so itself
    with open(path) as source:
        tree = ast.parse(source.read(), path)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("torch"):
            continue
        try:
            module = importlib.import_module(node.module)
        except ImportError as e:
            module = types.ModuleType(node.module)
            module.__doc__ = f"stand-in made by ptests_plugin: {e}"
            sys.modules[node.module] = module
        for alias in node.names:
            if alias.name != "*" and not hasattr(module, alias.name):
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule
                except ImportError:
                    setattr(module, alias.name, _stand_in(module, alias.name))
                    print(f"ptests_plugin: {node.module}.{alias.name} is missing here: stand-in", file=sys.stderr)


# Private functions of torch._C by the name older test files call them, and the function each became.
# PyTorch 2.8 renamed the pair that routes a thread's requests to a private pool (2.6's
# test_allocate_in_thread_to_pool calls the old names: without them its thread dies before it ends
# its route, and the route stays open for the rest of the run).
RENAMED = {"_cuda_beginAllocateCurrentStreamToPool": "_cuda_beginAllocateCurrentThreadToPool",
           "_cuda_endAllocateCurrentStreamToPool": "_cuda_endAllocateToPool"}


def _shim_renamed():
    try:
        import torch
    except ImportError:
        return
    for old, new in RENAMED.items():
        if not hasattr(torch._C, old) and hasattr(torch._C, new):
            setattr(torch._C, old, getattr(torch._C, new))
            print(f"ptests_plugin: torch._C.{old} is {new} in this PyTorch: stand-in", file=sys.stderr)


def _shim_expecttest():
    try:
        import expecttest  # noqa: F401
    except ImportError:
        module = types.ModuleType("expecttest")
        module.__doc__ = "minimal stand-in made by ptests_plugin (expecttest is not installed)"
        module.ACCEPT = False

        class TestCase(unittest.TestCase):
            longMessage = True

            def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 (expecttest's name)
                self.assertEqual(_normalise(expect), _normalise(actual))

            def assertExpectedRaisesInline(self, exc_type, callable, expect, *args, **kwargs):  # noqa: N802
                with self.assertRaises(exc_type) as caught:
                    callable(*args, **kwargs)
                self.assertExpectedInline(str(caught.exception), expect)

        module.TestCase = TestCase
        sys.modules["expecttest"] = module


def _normalise(text):
    import textwrap
    return textwrap.dedent(str(text)).strip()
