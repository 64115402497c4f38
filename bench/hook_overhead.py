# SPDX-License-Identifier: MIT
"""The Python floor for offload-bench's hook benchmark.

Same ops and shapes as bench/hook.cpp (run_hook): leaf float32[16] -> * 1.0
-> 256 x sin() (one saved 64-byte tensor each) -> sum().backward(), with and
without torch.autograd.graph.saved_tensors_hooks(identity, identity). Per
round both runs, in alternating order; ns per tensor = (t_hooks - t_none) /
tensors saved, t = process CPU time. Writes flat keys that offload-bench reads:

    python bench/hook_overhead.py OUT.json [--quick]
"""

import json
import platform
import statistics
import sys
import time

import torch

OPS = 256
NUMEL = 16


def measure(make_ctx, warmup, rounds, device="cpu"):
    """Per round, the same graph (its tensors on `device`) without and inside
    make_ctx(), in alternating order; returns (ns per saved tensor, ns per op
    without hooks) lists, t = process CPU time. None when one run does not
    save OPS tensors."""
    leaf = torch.ones(NUMEL, dtype=torch.float32, device=device, requires_grad=True)
    sync = torch.get_device_module(device).synchronize if device != "cpu" else lambda: None

    def run() -> None:
        x = leaf * 1.0
        for _ in range(OPS):
            x = x.sin()
        x.sum().backward()
        leaf.grad = None
        sync()

    def hooked() -> None:
        with make_ctx():
            x = leaf * 1.0
            for _ in range(OPS):
                x = x.sin()
        x.sum().backward()
        leaf.grad = None
        sync()

    # How many tensors one run saves (must equal OPS, like the C++ check).
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(1) or t, lambda t: t):
        x = leaf * 1.0
        for _ in range(OPS):
            x = x.sin()
    x.sum().backward()
    if len(seen) != OPS:
        print(f"hook_overhead.py: one run saved {len(seen)} tensors, expected {OPS}", file=sys.stderr)
        return None

    for _ in range(warmup):
        run()
        hooked()
    per_tensor, base = [], []
    clock = time.process_time_ns  # CPU time of the process, like offload-bench
    for r in range(rounds):
        if r % 2 == 0:
            t0 = clock()
            run()
            t1 = clock()
            hooked()
            t2 = clock()
            t_none, t_hook = t1 - t0, t2 - t1
        else:
            t0 = clock()
            hooked()
            t1 = clock()
            run()
            t2 = clock()
            t_hook, t_none = t1 - t0, t2 - t1
        per_tensor.append((t_hook - t_none) / OPS)
        base.append(t_none / OPS)
    return per_tensor, base


def identity_hooks():
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)


def main() -> int:
    out = sys.argv[1]
    quick = "--quick" in sys.argv[2:]
    warmup, rounds = (5, 100) if quick else (20, 600)
    torch.set_num_threads(1)  # tiny tensors; the C++ side does the same
    measured = measure(identity_hooks, warmup, rounds)
    if measured is None:
        return 1
    per_tensor, base = measured
    q = statistics.quantiles(per_tensor, n=4)
    result = {
        "python_ns_per_tensor": statistics.median(per_tensor),
        "python_ns_per_tensor_q1": q[0],
        "python_ns_per_tensor_q3": q[2],
        "python_ns_per_tensor_min": min(per_tensor),
        "python_ns_per_tensor_max": max(per_tensor),
        "python_baseline_ns_per_op": statistics.median(base),
        "rounds": rounds,
        "ops_per_run": OPS,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(
        f"python identity hooks: {result['python_ns_per_tensor']:.0f} ns per saved tensor "
        f"(IQR {q[0]:.0f}..{q[2]:.0f}), no-hooks {result['python_baseline_ns_per_op']:.0f} ns per op"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
