#!/usr/bin/env python3
"""The first-run checks of a CUDA machine: one case per known risk of the
CUDA path (the findings of the CUDA read-through: a shared reload consumed
on two streams, statistics read before CUDA's first allocation, the
target's peak by active bytes, host waits in backward, stream capture),
each printing one line `PASS name: figure` or `FAIL name: figure`.

    PYTHONPATH=build-gpu/python python3 tests/gpu_check/first_run.py

Exit status: 0 when every case passed, 1 when one failed, 3 when no CUDA
device is visible (one line says so). Each case runs in well under a
minute on one GPU; the whole script in about two.
"""

import contextlib
import subprocess
import sys
import textwrap
import time

import torch

results = []


def report(name, ok, figure):
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}: {figure}", flush=True)


def case(fn):
    try:
        fn()
    except Exception as e:  # a case that raises fails, the others still run
        report(fn.__name__, False, f"raised {type(e).__name__}: {e}")
    return fn


def manager(**kw):
    import torch_offload

    return torch_offload.Manager("cuda", sync="streamed", min_offload_bytes=0, **kw)


def shared_reload_two_streams():
    # One activation saved through two views by matmuls forward ran on two
    # streams: one reload, consumed on both in backward; 20 runs bitwise.
    x0 = torch.randn(8192, 8192, device="cuda")  # 256 MiB: its copy back takes milliseconds
    w1 = torch.randn(8192, 64, device="cuda", requires_grad=True)
    w2 = w1.detach().clone().requires_grad_()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def run(m):
        w1.grad = w2.grad = None
        with m if m is not None else contextlib.nullcontext():
            x = x0 * 1
            for s in (s1, s2):
                s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s1):
                a = x @ w1
            with torch.cuda.stream(s2):
                b = x.t().t() @ w2
            for s in (s1, s2):
                torch.cuda.current_stream().wait_stream(s)
            loss = a.sum() + b.sum()
        loss.backward()
        torch.cuda.synchronize()
        return w1.grad.clone(), w2.grad.clone()

    ref = run(None)
    m = manager(max_fwd_stash=1)
    bad = sum(not all(torch.equal(r, g) for r, g in zip(ref, run(m), strict=True)) for _ in range(20))
    shared = m.stats().reloads_shared
    report("shared_reload_two_streams", bad == 0 and shared > 0, f"{bad} of 20 runs differ, reloads_shared={shared}")


def statistics_before_first_allocation():
    # A target reads the allocator's statistics at the first `with`, before
    # CUDA's lazy initialisation: not reported, never std::terminate.
    code = textwrap.dedent(
        """
        import torch, torch_offload
        m = torch_offload.Manager("cuda", device_target_bytes=1 << 30)
        with m:
            x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
            (x * x).sum().backward()
        print("ok")
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    ok = run.returncode == 0 and "ok" in run.stdout
    report("statistics_before_first_allocation", ok, f"exit {run.returncode} {run.stderr.strip()[-200:]}")


def target_peak_by_active_bytes():
    # Streamed under a target: the step's peak as the allocator's active
    # bytes (blocks held for the side stream included) within 2 %.
    w = (torch.randn(4096, 4096, device="cuda") / 64).requires_grad_()
    x = torch.randn(4096, 4096, device="cuda")

    def step(m):
        w.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_stats()["active_bytes.all.current"]
        with m if m is not None else contextlib.nullcontext():
            h = x
            for _ in range(12):
                h = torch.tanh(h @ w)
            loss = h.sum()
        loss.backward()
        torch.cuda.synchronize()
        return torch.cuda.memory_stats()["active_bytes.all.peak"] - base

    plain = step(None)
    stats0 = torch.cuda.memory_stats()
    base = stats0["active_bytes.all.current"]
    target = base + int(0.6 * plain)
    m = manager(device_target_bytes=target)
    worst = 0.0
    for s in range(5):
        peak = step(m)
        if s >= 2:
            worst = max(worst, (base + peak) / target)
    limbo = stats0["active_bytes.all.current"] - stats0["allocated_bytes.all.current"]
    report(
        "target_peak_by_active_bytes", worst <= 1.02, f"worst step peak {worst:.3f}x the target (limbo now {limbo} B)"
    )


def no_host_waits_in_backward():
    # A second of GPU work queued after forward: backward's host time with
    # Streamed (PinnedHost) must not wait for it; host_waits stays 0.
    w = torch.randn(2048, 2048, device="cuda", requires_grad=True)
    m = manager(max_fwd_stash=2)
    with m:
        h = w
        for _ in range(16):
            h = torch.tanh(h @ w)
        loss = h.sum()
    torch.cuda._sleep(2_000_000_000)  # about a second of device time
    t0 = time.perf_counter()
    loss.backward()
    host_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    waits = m.stats().host_waits
    report(
        "no_host_waits_in_backward",
        host_s < 0.2 and waits == 0,
        f"backward returned after {host_s:.3f} s, host_waits={waits}",
    )


def stream_capture():
    # Saving tensors under CUDA graph capture: a clear error naming the
    # library or a counted pass-through, never a broken capture.
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1)).cuda()
    x = torch.randn(64, 256, device="cuda")
    m = manager()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(x).sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    outcome = "captured"
    try:
        with torch.cuda.graph(g), m:
            loss = model(x).sum()
        g.replay()
        torch.cuda.synchronize()
        del loss
    except RuntimeError as e:
        outcome = f"raised: {str(e)[:160]}"
    ok = outcome == "captured" or "offload" in outcome
    torch.cuda.synchronize()
    report("stream_capture", ok, outcome)


def main():
    if not torch.cuda.is_available():
        print("first_run: no CUDA device is visible")
        return 3
    for fn in (
        statistics_before_first_allocation,
        shared_reload_two_streams,
        target_peak_by_active_bytes,
        no_host_waits_in_backward,
        stream_capture,
    ):
        case(fn)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
