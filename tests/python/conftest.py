# SPDX-License-Identifier: MIT
"""pytest setup: the package from the build tree (PYTHONPATH, set by
tests/meson.build) and the simulated device, installed once per process
with checking mode on and a link latency that widens race windows."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import torch_offload.sim  # noqa: E402

LATENCY_US = 50
torch_offload.sim.install(copy_latency_us=LATENCY_US, poison_freed=True)
torch.set_num_threads(1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.when == "call":
        item.call_failed = report.failed


@pytest.fixture(autouse=True)
def memory_returns_to_baseline(request):
    """Every case that passed leaves host and device bytes where it found
    them (a failed one may still hold its tensors in the traceback)."""
    import gc

    gc.collect()
    torch_offload.sim.synchronize(0)
    device0 = torch_offload.sim.device_memory(0)["current_bytes"]
    host0 = torch_offload.sim.host_memory()["current_bytes"]
    yield
    import gc

    if getattr(request.node, "call_failed", False):
        return
    gc.collect()
    for i in range(torch_offload.sim.config()["num_devices"]):
        torch_offload.sim.synchronize(i)
    assert torch_offload.sim.device_memory(0)["current_bytes"] == device0
    assert torch_offload.sim.host_memory()["current_bytes"] == host0


def pytest_terminal_summary(terminalreporter):
    """The closing line scripts/count-tests.py counts: "N passed, N failed"
    (errors count as failed; a run that collected nothing exits non-zero
    and is counted as a failure)."""
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    terminalreporter.write_line(f"{passed} passed, {failed} failed")
