# SPDX-License-Identifier: MIT
"""pytest setup: the package from the build tree (PYTHONPATH, set by
tests/meson.build), the device of the suite (OFFLOAD_TEST_DEVICE: sim, the
default, or cuda; testdevice.py), and on sim the simulated device,
installed once per process with checking mode on and a link latency that
widens race windows. On another device sim is not installed: a registered
PrivateUse1 backend is the accelerator LibTorch detects first, and the
cases that let device="auto" choose must get the device under test. A
value of OFFLOAD_TEST_DEVICE the suite cannot run on stops it before any
case."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import testdevice  # noqa: E402

LATENCY_US = 50
if testdevice.DEV == "sim" and not testdevice.LISTING:
    testdevice.install_sim(copy_latency_us=LATENCY_US)
torch.set_num_threads(1)


def pytest_configure(config):
    problem = testdevice.error()
    if problem:
        raise pytest.UsageError(problem)
    if testdevice.DEV == "cuda":
        # Bitwise comparisons need deterministic kernels (an operation
        # without one warns; the comparison of its case decides).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """test_compile.py runs last: what torch.compile imports and keeps
    (AOTAutograd, FX passes, sympy) adds about a third to the objects that
    the gc.collect() of every later case's memory check (below) walks. A
    stable sort, after pytest's own ordering by fixture scope."""
    items.sort(key=lambda item: item.path.name == "test_compile.py")
    if testdevice.LISTING:
        _list_skips(items)


def _list_skips(items):
    """OFFLOAD_TEST_LIST_SKIPS=DEVICE: the cases a skip mark skips on DEVICE
    (the marks' conditions were evaluated as on it), one line each with the
    reason, and their count; nothing runs (use with --collect-only)."""
    skipped = []
    for item in items:
        for mark in item.iter_markers():
            if mark.name == "skip" or (mark.name == "skipif" and mark.args and mark.args[0] is True):
                skipped.append((item.nodeid, mark.kwargs.get("reason", "")))
                break
    for nodeid, reason in skipped:
        print(f"skip on {testdevice.DEV}: {nodeid}: {reason}")
    print(
        f"{len(skipped)} of {len(items)} cases skip on {testdevice.DEV} by their marks "
        "(a case may also skip itself at run time)"
    )


def pytest_report_header(config):
    return f"OFFLOAD_TEST_DEVICE: {testdevice.DEV}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.when == "call":
        item.call_failed = report.failed


@pytest.fixture(autouse=True)
def memory_returns_to_baseline(request):
    """Every case that passed leaves device bytes (on sim also host bytes)
    where it found them (a failed one may still hold its tensors in the
    traceback)."""
    import gc

    gc.collect()
    testdevice.release_workspaces()
    testdevice.synchronize(0)
    device0 = testdevice.device_bytes(0)
    host0 = testdevice.host_bytes()
    yield
    import gc

    if getattr(request.node, "call_failed", False):
        return
    gc.collect()
    testdevice.release_workspaces()
    for i in range(testdevice.device_count()):
        testdevice.synchronize(i)
    assert testdevice.device_bytes(0) == device0
    assert testdevice.host_bytes() == host0


def pytest_terminal_summary(terminalreporter):
    """The closing line scripts/count-tests.py counts: "N passed, N failed"
    (errors count as failed; a run that collected nothing exits non-zero
    and is counted as a failure)."""
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    terminalreporter.write_line(f"{passed} passed, {failed} failed")
