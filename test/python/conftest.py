"""Shared fixtures: a host backend and caches, and a way to run a child Python (for what is process
state: REFPOOL_CONF, the allocation log, a framework's one-time allocator swap)."""
import os
import subprocess
import sys
import textwrap

import pytest

import refpool


@pytest.fixture
def backend():
    """A host backend of its own, so its counters start at 0 in every test."""
    with refpool.Backend.new_host() as be:
        yield be


@pytest.fixture
def cache():
    """An exact-size cache with no idle limit, whatever REFPOOL_CONF says."""
    with refpool.Cache(from_environment=False) as c:
        yield c


def run_python(code, env=None, check=True, timeout=240):
    """Runs `code` (dedented) in a child of this interpreter with this environment plus `env`.
    Returns the CompletedProcess; with check, fails the test with the child's output if it failed."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=child_env, capture_output=True,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        pytest.fail(f"child python failed ({result.returncode}):\n--- stdout\n{result.stdout}\n--- stderr\n"
                    f"{result.stderr}")
    return result


def run_module(args, env=None, timeout=240):
    """Runs `python3 -m ARGS...` in a child; returns the CompletedProcess."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    return subprocess.run([sys.executable, "-m", *args], env=child_env, capture_output=True, text=True,
                          timeout=timeout)


def cuda_device_count():
    """CUDA devices refpool's CUDA backend can use here (0 without a driver or a device)."""
    try:
        refpool.Backend.cuda(0).close()
        return 1
    except refpool.BackendUnavailableError:
        return 0


def child_json(code, env=None, timeout=240):
    """Runs `code` in a child Python and returns the JSON object it printed on its last line."""
    import json
    result = run_python(code, env=env, timeout=timeout)
    return json.loads(result.stdout.strip().splitlines()[-1])
