# SPDX-License-Identifier: MIT
"""The device the Python suite runs on: OFFLOAD_TEST_DEVICE, ``sim`` (the
default: the simulated device with a link latency, poisoning of freed
memory and stream-order checking, installed by conftest.py: install_sim)
or ``cuda``; and device memory in one
call for either. Cases that need sim itself (its knobs, its copy latency,
poisoning of freed memory, its device module, its collectives) carry
``sim_only(reason)`` and are skipped, with that reason, on another device."""

import os

import pytest
import torch

ACCEPTED = ("sim", "cuda")
# OFFLOAD_TEST_LIST_SKIPS=cuda: collection only, as on that device (no
# device needed): conftest.py prints the cases a mark skips there, with
# their reasons (scripts/gpu-check --list).
LISTING = os.environ.get("OFFLOAD_TEST_LIST_SKIPS", "")
DEV = LISTING or os.environ.get("OFFLOAD_TEST_DEVICE", "") or "sim"


def error():
    """None when the suite can run on DEV; else one line naming
    OFFLOAD_TEST_DEVICE, its value and what is wrong."""
    if DEV not in ACCEPTED:
        return f"OFFLOAD_TEST_DEVICE={DEV!r} is not a test device (accepted: sim, the default, or cuda)"
    if DEV == "cuda" and not LISTING:
        import torch_offload

        if "cuda" not in torch_offload._C.compiled_device_policies():
            return "OFFLOAD_TEST_DEVICE=cuda: this torch_offload has no device::Cuda (a CUDA torch build is needed)"
        if not torch.cuda.is_available():
            return (
                "OFFLOAD_TEST_DEVICE=cuda: no CUDA device is visible (run the suite on sim: unset OFFLOAD_TEST_DEVICE)"
            )
    return None


def install_sim(**knobs):
    """Installs sim for the suite: the given knobs, freed memory poisoned and
    stream order checked (torch_offload.sim.install's check_streams: every
    offloading case runs checked, and a missing wait or record_stream
    raises from the operator that shows it)."""
    import torch_offload.sim

    torch_offload.sim.install(poison_freed=True, **knobs)
    if os.environ.get("OFFLOAD_SIM_CHECK_STREAMS") != "0":  # 0: left off, to compare
        torch_offload.sim.set_check_streams(True)


def sim_only(reason):
    """Marks a case (or a module, as ``pytestmark``) that needs sim: skipped
    on another device with `reason`."""
    return pytest.mark.skipif(DEV != "sim", reason=f"sim only: {reason}")


def drain_autograd(index=0):
    """Waits until autograd's thread for device `index` has let go of what
    the last backward on that device gave it. The engine runs a device's
    nodes on a thread of its own and wakes the caller when the graph is
    done, before that thread drops its last task (the node run last and
    the gradients it was given): those bytes are freed just after backward
    returns, up to tens of ms later on a busy host. A backward of nothing
    on the same thread runs after that drop; it allocates no memory."""
    with torch.enable_grad():
        empty = torch.zeros(0, device=f"{DEV}:{index}", requires_grad=True)
        torch.autograd.grad((empty * 2).sum(), empty)


def synchronize(index=0):
    """Waits for the device's queued work and for autograd's thread for
    it (drain_autograd), so that device bytes read next are settled."""
    drain_autograd(index)
    if DEV == "sim":
        import torch_offload.sim

        torch_offload.sim.synchronize(index)
    else:
        torch.cuda.synchronize(index)
        # Blocks freed while a side stream still used them come back to the
        # allocator's count only when it processes its events: this does.
        torch.cuda.empty_cache()


def warm_up():
    """On CUDA, creates cuBLAS's workspaces, which the caching allocator
    serves at the first matrix product of each thread and stream and keeps
    (this thread's and autograd's device thread's), then synchronizes:
    device bytes counted from after this call leave them out. On sim,
    synchronizes."""
    if DEV == "cuda":
        x = torch.ones(8, 8, device="cuda", requires_grad=True)
        (x @ x).sum().backward()
    synchronize(0)


def release_workspaces():
    """On CUDA, frees cuBLAS's workspaces (the next matrix product takes
    them again), so that device bytes compare equal across a case that
    made them; nothing on sim."""
    if DEV == "cuda":
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()


def device_bytes(index=0):
    """Bytes allocated on device `index` now."""
    if DEV == "sim":
        import torch_offload.sim

        return torch_offload.sim.device_memory(index)["current_bytes"]
    return torch.cuda.memory_allocated(index)


def peak_bytes(index=0):
    """The most bytes allocated on device `index` at once since reset_peak(index)."""
    if DEV == "sim":
        import torch_offload.sim

        return torch_offload.sim.device_memory(index)["peak_bytes"]
    return torch.cuda.max_memory_allocated(index)


def reset_peak(index=0):
    if DEV == "sim":
        import torch_offload.sim

        torch_offload.sim.reset_peak(index)
    else:
        torch.cuda.reset_peak_memory_stats(index)


def device_count():
    if DEV == "sim":
        import torch_offload.sim

        return torch_offload.sim.config()["num_devices"]
    return torch.cuda.device_count()


def host_bytes():
    """Bytes of sim's host allocator now; None on another device (no count
    of host memory to compare)."""
    if DEV != "sim":
        return None
    import torch_offload.sim

    return torch_offload.sim.host_memory()["current_bytes"]
