#!/usr/bin/env python3
"""Runs one pytest file for `meson test`: exit 77 (skipped) where pytest is missing or every test of
the file skipped (no framework, no GPU), else pytest's own status.

REFPOOL_TEST_PYTHON names another interpreter to run it with (one that has torch, cupy or numba)."""
import os
import sys

wanted = os.environ.get("REFPOOL_TEST_PYTHON")
if wanted and os.path.realpath(wanted) != os.path.realpath(sys.executable):
    os.execv(wanted, [wanted, *sys.argv])

SKIPPED = 77
try:
    import pytest
except ImportError:
    print(f"{sys.executable} has no pytest (Debian: apt-get install python3-pytest): skipped")
    sys.exit(SKIPPED)


class Outcomes:
    def __init__(self):
        self.passed = self.skipped = self.failed = 0

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.skipped:
            self.skipped += 1
        elif report.failed:
            self.failed += 1

    def pytest_collectreport(self, report):
        if report.skipped:  # a module-level importorskip
            self.skipped += 1


outcomes = Outcomes()
status = pytest.main(["-v", "-rs", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[outcomes])
if status in (0, 5) and outcomes.passed == 0 and outcomes.failed == 0 and outcomes.skipped > 0:
    sys.exit(SKIPPED)
sys.exit(int(status))
