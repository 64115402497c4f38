# SPDX-License-Identifier: MIT
"""A process that used sim exits with its own status.

LibTorch's autograd thread of a device can still hold the last backward
pass's graph task, and with it the Python objects of the saved-tensor hooks
that were active, when that pass has returned; released once the
interpreter is finalizing, they need the GIL, which the thread cannot take
then, and the process aborts. torch_offload.sim's exit drain
(_sim.drain_for_exit, from Python's atexit) first has every sim device's
autograd thread release what it holds (_sim.release_autograd_threads), then
runs the work left on sim's streams and from then on runs stream work on
the thread that queues it.

- The release, checked in this process: with the GIL held throughout (so
  the autograd thread cannot release anything by itself), the hooks of a
  backward pass are gone right after release_autograd_threads().
- The exit itself: 200 runs each of a save_on_cpu(pin_memory=True) script
  and a Manager (Streamed) script, each its own process ending with pinned
  host tensors, non-blocking copies, stream workers and autograd's device
  threads alive; none may end otherwise than with 0 (exit_runs.py).
"""

import gc
import os
import subprocess
import sys
import weakref

import pytest
import torch

import testdevice

RUNS = 200

pytestmark = pytest.mark.skipif(testdevice.DEV != "sim", reason="sim's exit: the suite's device is not sim")


class _Hook:
    """A saved-tensor hook whose lifetime a weak reference can watch."""

    def __call__(self, t):
        return t


def test_autograd_threads_release_the_hooks_of_the_last_backward():
    from torch_offload.sim import _sim

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).to("sim")
    x = torch.randn(32, 64, device="sim", requires_grad=True)
    pack, unpack = _Hook(), _Hook()
    region = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
    watched = weakref.ref(pack)
    del pack, unpack
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000)  # this thread keeps the GIL: nothing is released behind our back
    try:
        with region:
            model(x).square().sum().backward()
        del region
        gc.collect()
        _sim.release_autograd_threads()
        assert watched() is None, "an autograd thread still holds the hooks of the last backward pass"
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.parametrize("variant", ["save_on_cpu", "manager"])
def test_processes_that_used_sim_exit_cleanly(variant):
    script = os.path.join(os.path.dirname(__file__), "exit_runs.py")
    done = subprocess.run([sys.executable, script, variant, str(RUNS)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"{variant} {RUNS} runs, 0 non-zero exits" in done.stdout, done.stdout + done.stderr[-4000:]
