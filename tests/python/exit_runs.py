# SPDX-License-Identifier: MIT
"""Runs a short sim training script many times, each in its own process that
ends the way every Python program does (atexit handlers, interpreter
finalization, the C++ runtime's exit), and prints one line per variant:
"VARIANT RUNS runs, N non-zero exits: [codes]".

usage: exit_runs.py VARIANT RUNS [JOBS]   (VARIANT: save_on_cpu or manager;
JOBS: processes at once, default 2)

The script at the moment of exit still holds what makes sim's exit fragile:
pinned host tensors, non-blocking copies, stream workers and autograd's
device threads. To keep 200 runs cheap, this process imports torch and
installs sim once, then forks one child per run (before any stream worker
or autograd thread exists, so each child starts its own); a child runs the
script and leaves through sys.exit, so its exit is a normal interpreter
exit. (The objects imported so far are frozen out of the garbage
collector's reach first: an interpreter exit with torch loaded otherwise
spends most of its time walking them, copy-on-write page by page.) The
exit status is what the parent's waitpid reads: a process killed by a
signal (SIGABRT: "terminate called without an active exception") counts
as non-zero.
"""

import gc
import os
import sys

import torch

import torch_offload
import torch_offload.sim


def model_and_input():
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).to("sim")
    return model, torch.randn(128, 512, device="sim", requires_grad=True)


def save_on_cpu_script():
    model, x = model_and_input()
    with torch.autograd.graph.save_on_cpu(pin_memory=True):
        model(x).square().sum().backward()


def manager_script():
    model, x = model_and_input()
    manager = torch_offload.Manager("sim", sync="streamed")
    with manager:
        model(x).square().sum().backward()
    assert manager.stats().storages_offloaded > 0


SCRIPTS = {"save_on_cpu": save_on_cpu_script, "manager": manager_script}


def child(script):
    """Runs `script` in this (forked) process, then exits the interpreter."""
    try:
        script()
    except BaseException as error:  # noqa: BLE001  reported through the exit status
        print(f"run failed: {error!r}", file=sys.stderr)
        sys.exit(3)
    sys.exit(0)


def main():
    variant, runs = sys.argv[1], int(sys.argv[2])
    jobs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    script = SCRIPTS[variant]
    torch_offload.sim.install(copy_latency_us=50, poison_freed=True)
    gc.freeze()
    codes, running, started = [], 0, 0
    while started < runs or running:
        if started < runs and running < jobs:
            if os.fork() == 0:
                child(script)
            started += 1
            running += 1
            continue
        _, status = os.wait()
        running -= 1
        codes.append(os.waitstatus_to_exitcode(status))
    bad = [c for c in codes if c != 0]
    print(f"{variant} {runs} runs, {len(bad)} non-zero exits: {sorted(set(bad))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
