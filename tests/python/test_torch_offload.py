# SPDX-License-Identifier: MIT
"""torch_offload from Python, on the simulated device with a copy delay and
poisoning of freed memory (conftest.py): bitwise parity of losses and
gradients with the same run without offloading, for Blocking and Streamed,
over a GPT and the bug classes of DESIGN.md section 1; the peers' names;
bad input; the device module; the README snippet."""

import contextlib
import os
import re
import subprocess
import sys
import threading

import pytest
import torch
import torch.utils.checkpoint

import gpt
import torch_offload
import torch_offload.sim

SYNCS = ["blocking", "streamed"]
DEV = "sim"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bits(t):
    """A tensor's bytes on the CPU: equal bits, not just equal values."""
    t = t.detach().to("cpu").contiguous()
    return t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def assert_bitwise(ref, got):
    assert len(ref) == len(got)
    for i, (a, b) in enumerate(zip(ref, got)):
        assert a.device == b.device, f"result {i}: device {b.device}, expected {a.device}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"result {i}: dtype/shape differ"
        assert torch.equal(bits(a), bits(b)), f"result {i} differs bitwise"


def parity(run, sync, min_offloaded=1, **options):
    """run(ctx) -> list of tensors. Runs it without offloading and inside a
    Manager; the results must be bitwise equal and something offloaded."""
    ref = run(contextlib.nullcontext())
    manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=options.pop("min_offload_bytes", 64),
                                    **options)
    got = run(manager)
    assert_bitwise(ref, got)
    stats = manager.stats()
    assert stats.tensors_offloaded >= min_offloaded, stats
    return stats


def leaf(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEV).requires_grad_()


# ---------------------------------------------------------------- the GPT

@pytest.mark.parametrize("sync", SYNCS)
def test_gpt_three_adamw_steps_bitwise(sync):
    def run(ctx):
        model = gpt.make(DEV, layers=2, width=64, heads=4, seq=32)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        idx, targets = gpt.batch(DEV, batch_size=2, seq=32)
        out = []
        for _ in range(3):
            opt.zero_grad()
            with ctx:
                loss = model.loss(idx, targets)
            loss.backward()
            out += [loss.detach()] + [p.grad.clone() for p in model.parameters()]
            opt.step()
        return out + [p.detach().clone() for p in model.parameters()]

    stats = parity(run, sync, min_offloaded=30, min_offload_bytes=1024)
    assert stats.bytes_reloaded > 0 or stats.stash_reuses > 0
    assert stats.passed_leaf > 0  # parameters stay


# ---------------------------------------------------------------- bug classes

@pytest.mark.parametrize("sync", SYNCS)
def test_views_with_storage_offsets(sync):
    def run(ctx):
        a = leaf(64, 32)
        with ctx:
            base = a * 2.0
            parts = [base[8:24], base[40:], base[:, 5:17], base[3]]
            loss = sum((p.sin() * p).sum() for p in parts)
        loss.backward()
        return [loss.detach(), a.grad]

    stats = parity(run, sync)
    assert stats.tensors_aliased > 0  # one storage, several views: offloaded once


@pytest.mark.parametrize("sync", SYNCS)
def test_transposes_of_square_non_leaf_matrices(sync):
    def run(ctx):
        a = leaf(48, 48)
        with ctx:
            m = a.tanh()
            t = m.t()
            loss = (t @ m).sum() + (m @ t.exp()).sum()
        loss.backward()
        return [loss.detach(), a.grad]

    parity(run, sync)


@pytest.mark.parametrize("sync", SYNCS)
def test_stride_zero_expands(sync):
    def run(ctx):
        v = leaf(1, 256)
        w = leaf(256, 256, seed=1)
        with ctx:
            e = (v * 3.0).expand(256, 256)
            loss = (e * w.sin()).sum() + (e.t() @ w).sum()
        loss.backward()
        return [loss.detach(), v.grad, w.grad]

    parity(run, sync)


class CpuSaved(torch.autograd.Function):
    """Saves a CPU tensor on purpose (e.g. an index table): it must come back on the CPU."""

    @staticmethod
    def forward(ctx, x, table):
        ctx.save_for_backward(x, table)
        return x * table.to(x.device)

    @staticmethod
    def backward(ctx, grad):
        x, table = ctx.saved_tensors
        assert table.device.type == "cpu" and x.device.type == DEV
        return grad * table.to(grad.device), None


@pytest.mark.parametrize("sync", SYNCS)
def test_cpu_tensors_saved_by_a_custom_function_stay_on_cpu(sync):
    def run(ctx):
        a = leaf(128, 64)
        table = torch.linspace(0, 1, 64 * 128).reshape(128, 64)
        with ctx:
            loss = CpuSaved.apply(a.exp(), table).sum()
        loss.backward()
        return [loss.detach(), a.grad]

    stats = parity(run, sync)
    assert stats.passed_other_device >= 1


@pytest.mark.parametrize("sync", SYNCS)
def test_unused_branch_then_next_step(sync):
    def run(ctx):
        a = leaf(64, 64)
        out = []
        for _ in range(2):
            with ctx:
                h = a.sin()
                unused = (h.exp() * h).sum()  # saved tensors never unpacked
                loss = (h * h).sum()
            loss.backward()
            del unused
            out += [loss.detach(), a.grad.clone()]
            a.grad = None
        return out

    parity(run, sync)


@pytest.mark.parametrize("sync", SYNCS)
def test_partial_autograd_grad_then_new_forward(sync):
    def run(ctx):
        a = leaf(64, 64)
        b = leaf(64, 64, seed=1)
        with ctx:
            x = a.sin() * b.cos()
            y1 = (x.exp()).sum()
            y2 = (x.tanh() * b).sum()
        (ga,) = torch.autograd.grad(y1, [a])
        with ctx:
            z = (a.sigmoid() * b).pow(2).sum()
        z.backward()
        return [y1.detach(), y2.detach(), ga, z.detach(), a.grad, b.grad]

    parity(run, sync)


@pytest.mark.parametrize("sync", SYNCS)
def test_retain_graph(sync):
    def run(ctx):
        a = leaf(64, 64)
        with ctx:
            loss = (a.sin().exp() * a).sum()
        loss.backward(retain_graph=True)
        first = a.grad.clone()
        loss.backward()
        return [loss.detach(), first, a.grad]

    parity(run, sync)


@pytest.mark.parametrize("sync", SYNCS)
def test_double_backward(sync):
    def run(ctx):
        a = leaf(32, 32)
        with ctx:
            y = (a.sin() * a.exp()).sum()
        (g,) = torch.autograd.grad(y, [a], create_graph=True)
        with ctx:
            gg = (g * g).sum()
        gg.backward()
        return [y.detach(), g.detach(), a.grad]

    parity(run, sync)


@pytest.mark.parametrize("sync", SYNCS)
def test_checkpoint_inside_the_with(sync):
    def block(x, w):
        return (x @ w).tanh() @ w.t()

    def run(ctx):
        x = leaf(64, 64)
        w = leaf(64, 64, seed=1)
        with ctx:
            h = x.sin()
            h = torch.utils.checkpoint.checkpoint(block, h, w, use_reentrant=False)
            loss = (h.exp() * h).sum()
        loss.backward()
        return [loss.detach(), x.grad, w.grad]

    parity(run, sync)


@pytest.mark.parametrize("sync", SYNCS)
def test_gradient_accumulation(sync):
    def run(ctx):
        model = gpt.make(DEV, layers=1, width=32, heads=2, seq=16)
        for micro in range(3):
            idx, targets = gpt.batch(DEV, batch_size=2, seq=16, seed=micro)
            with ctx:
                loss = model.loss(idx, targets) / 3
            loss.backward()
        return [p.grad for p in model.parameters()]

    parity(run, sync)


@pytest.mark.parametrize("region", ["blocking", "streamed", "no_offload"])
def test_in_place_change_after_save_raises_autograds_error(region):
    a = leaf(64, 64)
    manager = torch_offload.Manager(DEV, sync=region, min_offload_bytes=64) if region != "no_offload" else None
    with manager if manager else torch_offload.no_offload():
        h = a * 2.0
        loss = h.sin().sum()  # sin saves h
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="one of the variables needed for gradient computation has been "
                                           "modified by an inplace operation"):
        loss.backward()
    if manager:
        assert manager.stats().tensors_offloaded == 1


@pytest.mark.parametrize("sync", SYNCS)
def test_two_threads_each_with_its_own_with(sync):
    manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=64)
    expected = {}
    for seed in (0, 1):
        a = leaf(64, 64, seed=seed)
        (a.sin().exp() * a).sum().backward()
        expected[seed] = a.grad
    results, errors = {}, []

    def work(seed):
        try:
            for _ in range(5):
                a = leaf(64, 64, seed=seed)
                with manager:
                    loss = (a.sin().exp() * a).sum()
                loss.backward()
                assert torch.equal(bits(a.grad), bits(expected[seed]))
            results[seed] = True
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == {0: True, 1: True}
    assert manager.stats().tensors_offloaded >= 20


def test_tensors_saved_on_another_thread_are_not_routed():
    manager = torch_offload.Manager(DEV, min_offload_bytes=64)
    seen = []
    with manager:
        t = threading.Thread(target=lambda: seen.append((leaf(64, 64).sin() * 2).sum()))
        t.start()
        t.join()
    seen[0].backward()
    assert manager.stats().tensors_seen == 0


# ---------------------------------------------------------------- API

def test_no_offload_keeps_tensors_where_they_are():
    a = leaf(64, 64)
    manager = torch_offload.Manager(DEV, min_offload_bytes=64)
    with manager:
        with torch_offload.no_offload():
            y = a.sin().exp().sum()
    y.backward()
    assert manager.stats().tensors_seen == 0


def test_nested_with_and_backward_after_exit():
    outer = torch_offload.Manager(DEV, sync="blocking", min_offload_bytes=64)
    inner = torch_offload.Manager(DEV, sync="streamed", min_offload_bytes=64)
    a = leaf(64, 64)
    with outer:
        h = a.sin()
        with inner:
            k = h.exp()
        loss = (k * h).sum()
    loss.backward()
    assert inner.stats().tensors_seen == 1  # exp's result
    assert outer.stats().tensors_seen == 3  # sin's input is a leaf; mul saves both
    assert outer.stats().passed_leaf == 1


def test_stats_is_a_dataclass_with_every_field():
    import dataclasses

    manager = torch_offload.Manager(DEV, min_offload_bytes=64)
    with manager:
        loss = leaf(64, 64).sin().exp().sum()
    loss.backward()
    s = manager.stats()
    assert dataclasses.is_dataclass(s)
    names = [f.name for f in dataclasses.fields(s)]
    assert names == torch_offload._C.stat_fields()
    assert {"tensors_offloaded", "bytes_offloaded", "host_bytes_peak", "prefetches"} <= set(names)
    # sin saves its input (a leaf: stays), exp its result (offloaded).
    assert s.tensors_seen == 2 and s.tensors_offloaded == 1 and s.bytes_offloaded == 64 * 64 * 4
    assert s.passed_through == s.passed_leaf == 1
    manager.reset_stats()
    assert manager.stats().tensors_seen == 0


def test_exclude_parameters():
    model = gpt.make(DEV, layers=1, width=32, heads=2, seq=16)
    manager = torch_offload.Manager(DEV, min_offload_bytes=0)
    manager.exclude(model.parameters())
    idx, targets = gpt.batch(DEV, batch_size=2, seq=16)
    with manager:
        w = model.lm_head.weight * 1.0  # a non-leaf view of a parameter's storage? no: a new tensor
        loss = model.loss(idx, targets) + (w * model.lm_head.weight.detach()).sum()
    loss.backward()
    assert manager.stats().passed_excluded >= 1


def test_repr_names_the_chosen_manager():
    assert "Manager<sim, pinned_host, streamed>" in repr(torch_offload.Manager())
    r = repr(torch_offload.Manager("sim", "pageable_host", "blocking"))
    assert "Manager<sim, pageable_host, blocking>" in r and "requested: 'sim'" in r
    generic = torch_offload.Manager("sim").describe()
    assert generic == "Manager<sim, pinned_host, streamed>"


def test_peer_names_accept_the_peers_arguments():
    trl_style = torch_offload.OffloadActivations(use_pin_memory=True, use_streams=True, min_offload_size=1024,
                                                 max_fwd_stash_size=5)
    assert "Manager<sim, pinned_host, streamed>" in repr(trl_style)
    blocking = torch_offload.OffloadActivations(use_pin_memory=False, use_streams=False)
    assert "Manager<sim, pageable_host, blocking>" in repr(blocking)
    tune_style = torch_offload.OffloadActivations(use_streams=None)
    assert tune_style.options["max_fwd_stash"] == 5
    with pytest.raises(ValueError, match="max_fwd_stash must be in \\[1, 1024\\], got 0"):
        torch_offload.OffloadActivations(max_fwd_stash_size=0)
    a = leaf(64, 64)
    with trl_style:
        with torch_offload.NoOpManager():
            y = a.sin().exp().sum()
    y.backward()
    assert trl_style.stats().tensors_seen == 0


@pytest.mark.parametrize("use_streams", [True, False])
def test_get_act_offloading_ctx_manager_keeps_the_head_on_the_device(use_streams):
    def run(ctx_of):
        model = gpt.make(DEV, layers=1, width=32, heads=2, seq=16)
        ctx = ctx_of(model)
        idx, targets = gpt.batch(DEV, batch_size=2, seq=16)
        with ctx:
            loss = model.loss(idx, targets)
        loss.backward()
        return [loss.detach()] + [p.grad for p in model.parameters()], ctx

    ref, _ = run(lambda m: contextlib.nullcontext())
    got, manager = run(lambda m: torch_offload.get_act_offloading_ctx_manager(m, use_streams=use_streams,
                                                                              min_offload_size=64))
    assert_bitwise(ref, got)
    with_head, plain = manager.stats(), None
    assert with_head.tensors_offloaded > 0
    plain_manager = torch_offload.OffloadActivations(use_streams=use_streams, min_offload_size=64)
    _, plain = run(lambda m: plain_manager)
    # The head (ln output saved by lm_head's matmul) was not offloaded.
    assert with_head.tensors_seen < plain.stats().tensors_seen
    assert isinstance(torch_offload.get_act_offloading_ctx_manager(torch.nn.Linear(2, 2), False),
                      contextlib.nullcontext)


def test_pass_through_fallback_and_unavailable_device():
    with pytest.raises(RuntimeError, match="device 'npu' is not available"):
        torch_offload.Manager("npu")
    m = torch_offload.Manager("npu", fallback="pass_through")
    assert "PassThrough<offloads nothing: device 'npu' is not available" in repr(m)
    a = leaf(64, 64)
    with m:
        y = a.sin().exp().sum()
    y.backward()
    assert m.stats().tensors_seen == 2 and m.stats().tensors_offloaded == 0


# ---------------------------------------------------------------- bad input

OPTION_CASES = [
    ("min_offload_bytes", -1, "offload::Options: min_offload_bytes must be in [0, 1125899906842624], got -1"),
    ("min_offload_bytes", 2**50 + 1,
     "offload::Options: min_offload_bytes must be in [0, 1125899906842624], got 1125899906842625"),
    ("max_fwd_stash", 0, "offload::Options: max_fwd_stash must be in [1, 1024], got 0"),
    ("max_fwd_stash", 1025, "offload::Options: max_fwd_stash must be in [1, 1024], got 1025"),
    ("prefetch_depth", -1, "offload::Options: prefetch_depth must be in [0, 1024], got -1"),
    ("host_budget_bytes", -5, "offload::Options: host_budget_bytes must be in [0, 1125899906842624], got -5"),
]


@pytest.mark.parametrize("field,value,message", OPTION_CASES)
def test_option_out_of_range_is_a_value_error_with_the_cpp_text(field, value, message):
    with pytest.raises(ValueError) as info:
        torch_offload.Manager(DEV, **{field: value})
    assert str(info.value) == message


NAME_CASES = [
    ({"device": "tpu"}, "torch_offload.Manager: device must be one of 'auto', 'cuda', 'xpu', 'npu', 'neuron', "
                        "'sim' or the name of a registered PrivateUse1 backend, got 'tpu'"),
    ({"storage": "nvme"}, "torch_offload.Manager: storage must be one of 'pinned_host', 'pageable_host', got 'nvme'"),
    ({"sync": "async"}, "torch_offload.Manager: sync must be one of 'blocking', 'streamed', got 'async'"),
    ({"fallback": "cpu"}, "torch_offload.Manager: fallback must be one of 'error', 'pass_through', got 'cpu'"),
]


@pytest.mark.parametrize("kwargs,message", NAME_CASES)
def test_unknown_names_list_the_accepted_ones(kwargs, message):
    with pytest.raises(ValueError) as info:
        torch_offload.Manager(**kwargs)
    compiled = torch_offload._C.compiled_device_policies()
    expected = message if "cuda" in compiled else message.replace("'cuda', ", "")
    assert str(info.value) == expected


def test_options_are_checked_before_names():
    with pytest.raises(ValueError, match="max_fwd_stash"):
        torch_offload.Manager("tpu", max_fwd_stash=0)


SIM_CASES = [
    ({"num_devices": 0}, ValueError, "num_devices"),
    ({"copy_delay_us": -1}, ValueError, "copy_delay_us"),
    ({"name": "Bad Name"}, ValueError, "backend_name"),
    ({"num_devices": 3}, RuntimeError, "num_devices: installed 2, requested 3"),
    ({"copy_delay_us": 7, "poison_freed": False}, RuntimeError, r"copy_delay_us: installed \d+, requested 7"),
]


@pytest.mark.parametrize("kwargs,error,pattern", SIM_CASES)
def test_sim_install_rejects_bad_or_different_configs(kwargs, error, pattern):
    args = {"copy_delay_us": torch_offload.sim.config()["copy_delay_us"], "poison_freed": True} | kwargs
    with pytest.raises(error, match=pattern):
        torch_offload.sim.install(**args)
    torch_offload.sim.install(copy_delay_us=args["copy_delay_us"] if "copy_delay_us" not in kwargs else
                              torch_offload.sim.config()["copy_delay_us"], poison_freed=True)  # same: no-op


def test_import_with_another_torch_version_is_an_import_error():
    code = "import torch; torch.__version__ = '0.0.1'; import torch_offload"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert run.returncode != 0
    assert "ImportError" in run.stderr
    assert f"built against torch {torch.__version__}" in run.stderr and "imported torch 0.0.1" in run.stderr


# ---------------------------------------------------------------- sim device module

def test_device_module_serves_device_generic_code():
    mod = torch.get_device_module("sim")
    assert mod is torch.sim
    assert mod.is_available() and mod.device_count() == 2 and mod.current_device() == 0
    s0 = mod.current_stream()
    s1 = mod.Stream()
    assert s0.stream_id == 0 and s1 != s0
    x = torch.ones(256, 256, device="sim")
    with mod.stream(s1):
        assert mod.current_stream() == s1
        s1.wait_stream(s0)
        host = torch.empty(256, 256, pin_memory=True)
        host.copy_(x, non_blocking=True)
        ev = s1.record_event()
    assert mod.current_stream() == s0
    s0.wait_event(ev)
    mod.synchronize()
    assert torch.equal(host, torch.ones(256, 256))
    e = mod.Event()
    e.record(s0)
    e.synchronize()
    assert e.query()
    mod.reset_peak_memory_stats()
    before = mod.memory_allocated()
    y = torch.empty(1024, device="sim")
    assert mod.memory_allocated() == before + 4096 and mod.max_memory_allocated() >= before + 4096
    del y, x, host
    mod.empty_cache()
    mod.set_device(1)
    assert mod.current_device() == 1 and torch.ones(1, device="sim").device == torch.device("sim", 1)
    mod.set_device(0)
    mod.manual_seed(3)
    mod.manual_seed_all(3)
    assert torch.ones(2).sim().device.type == "sim"


# ---------------------------------------------------------------- docs

def test_readme_python_snippet_runs():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    found = re.search(r"<!-- snippet:python[^>]*-->\s*```python\n(.*?)```", readme, re.S)
    assert found, "README.md has no <!-- snippet:python --> block"
    model = gpt.make(DEV, layers=1, width=32, heads=2, seq=16)
    optimizer = torch.optim.AdamW(model.parameters())
    inputs, targets = gpt.batch(DEV, batch_size=2, seq=16)
    namespace = {"model": model, "optimizer": optimizer, "inputs": inputs, "targets": targets, "steps": 2,
                 "loss_fn": lambda logits, t: torch.nn.functional.cross_entropy(logits.flatten(0, 1), t.flatten())}
    exec(compile(found.group(1), "README.md", "exec"), namespace)
    assert namespace["manager"].stats().tensors_offloaded > 0
