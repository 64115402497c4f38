# SPDX-License-Identifier: MIT
"""The bug classes of DESIGN.md section 1 as small training cases, shared
by the pytest suite and bench/peers.py (the correctness matrix).

Each case is ``case(make_ctx, device) -> list of tensors`` (losses and
gradients): ``make_ctx()`` returns a fresh context manager under which the
forward runs (``contextlib.nullcontext`` for the reference run). A case
whose reference run raises (in_place_after_save) is compared on its error.
"""

import threading

import torch
import torch.utils.checkpoint

import gpt


def leaf(device, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device).requires_grad_()


def gpt_three_adamw_steps(make_ctx, device):
    model = gpt.make(device, layers=2, width=64, heads=4, seq=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx, targets = gpt.batch(device, batch_size=2, seq=32)
    ctx = make_ctx()
    out = []
    for _ in range(3):
        opt.zero_grad()
        with ctx:
            loss = model.loss(idx, targets)
        loss.backward()
        out += [loss.detach()] + [p.grad.clone() for p in model.parameters()]
        opt.step()
    return out + [p.detach().clone() for p in model.parameters()]


def views_with_storage_offsets(make_ctx, device):
    a = leaf(device, 64, 32)
    with make_ctx():
        base = a * 2.0
        parts = [base[8:24], base[40:], base[:, 5:17], base[3]]
        loss = sum((p.sin() * p).sum() for p in parts)
    loss.backward()
    return [loss.detach(), a.grad]


def transposes_of_square_matrices(make_ctx, device):
    a = leaf(device, 48, 48)
    with make_ctx():
        m = a.tanh()
        t = m.t()
        loss = (t @ m).sum() + (m @ t.exp()).sum()
    loss.backward()
    return [loss.detach(), a.grad]


def stride_zero_expands(make_ctx, device):
    v = leaf(device, 1, 256)
    w = leaf(device, 256, 256, seed=1)
    with make_ctx():
        e = (v * 3.0).expand(256, 256)
        loss = (e * w.sin()).sum() + (e.t() @ w).sum()
    loss.backward()
    return [loss.detach(), v.grad, w.grad]


class CpuSaved(torch.autograd.Function):
    """Saves a CPU tensor on purpose (an index table): it must come back on the CPU."""

    @staticmethod
    def forward(ctx, x, table):
        ctx.save_for_backward(x, table)
        return x * table.to(x.device)

    @staticmethod
    def backward(ctx, grad):
        x, table = ctx.saved_tensors
        if table.device.type != "cpu" or x.device != grad.device:
            raise RuntimeError(f"saved tensors came back on {table.device} and {x.device}")
        return grad * table.to(grad.device), None


def cpu_tensor_saved_by_custom_function(make_ctx, device):
    a = leaf(device, 128, 64)
    table = torch.linspace(0, 1, 64 * 128).reshape(128, 64)
    with make_ctx():
        loss = CpuSaved.apply(a.exp(), table).sum()
    loss.backward()
    return [loss.detach(), a.grad]


def unused_branch(make_ctx, device):
    a = leaf(device, 64, 64)
    ctx = make_ctx()
    out = []
    for _ in range(2):
        with ctx:
            h = a.sin()
            unused = (h.exp() * h).sum()  # its saved tensors are never unpacked
            loss = (h * h).sum()
        loss.backward()
        del unused
        out += [loss.detach(), a.grad.clone()]
        a.grad = None
    return out


def partial_grad_then_new_forward(make_ctx, device):
    a = leaf(device, 64, 64)
    b = leaf(device, 64, 64, seed=1)
    ctx = make_ctx()
    with ctx:
        x = a.sin() * b.cos()
        y1 = x.exp().sum()
        y2 = (x.tanh() * b).sum()
    (ga,) = torch.autograd.grad(y1, [a])
    with ctx:
        z = (a.sigmoid() * b).pow(2).sum()
    z.backward()
    return [y1.detach(), y2.detach(), ga, z.detach(), a.grad, b.grad]


def retain_graph(make_ctx, device):
    a = leaf(device, 64, 64)
    with make_ctx():
        loss = (a.sin().exp() * a).sum()
    loss.backward(retain_graph=True)
    first = a.grad.clone()
    loss.backward()
    return [loss.detach(), first, a.grad]


def double_backward(make_ctx, device):
    a = leaf(device, 32, 32)
    ctx = make_ctx()
    with ctx:
        y = (a.sin() * a.exp()).sum()
    (g,) = torch.autograd.grad(y, [a], create_graph=True)
    with ctx:
        gg = (g * g).sum()
    gg.backward()
    return [y.detach(), g.detach(), a.grad]


def _checkpointed(x, w):
    return (x @ w).tanh() @ w.t()


def checkpoint_inside(make_ctx, device):
    x = leaf(device, 64, 64)
    w = leaf(device, 64, 64, seed=1)
    with make_ctx():
        h = x.sin()
        h = torch.utils.checkpoint.checkpoint(_checkpointed, h, w, use_reentrant=False)
        loss = (h.exp() * h).sum()
    loss.backward()
    return [loss.detach(), x.grad, w.grad]


def gradient_accumulation(make_ctx, device):
    model = gpt.make(device, layers=1, width=32, heads=2, seq=16)
    ctx = make_ctx()
    for micro in range(3):
        idx, targets = gpt.batch(device, batch_size=2, seq=16, seed=micro)
        with ctx:
            loss = model.loss(idx, targets) / 3
        loss.backward()
    return [p.grad for p in model.parameters()]


def in_place_after_save(make_ctx, device):
    a = leaf(device, 64, 64)
    with make_ctx():
        h = a * 2.0
        loss = h.sin().sum()  # sin saves h
    h.add_(1.0)
    loss.backward()  # must raise autograd's "modified by an inplace operation"
    return [a.grad]


def two_threads(make_ctx, device):
    """Two threads train at once, each inside its own `with` (one context
    object per thread); the results of both."""
    results, errors = {}, []

    def work(seed):
        try:
            a = leaf(device, 64, 64, seed=seed)
            ctx = make_ctx()
            out = []
            for _ in range(3):
                with ctx:
                    loss = (a.sin().exp() * a).sum()
                loss.backward()
                out += [loss.detach(), a.grad.clone()]
            results[seed] = out
        except Exception as e:  # re-raised on the calling thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results[0] + results[1]


CASES = {
    "gpt_3_adamw_steps": gpt_three_adamw_steps,
    "views_storage_offset": views_with_storage_offsets,
    "square_transposes": transposes_of_square_matrices,
    "stride0_expand": stride_zero_expands,
    "cpu_saved_by_function": cpu_tensor_saved_by_custom_function,
    "unused_branch": unused_branch,
    "partial_grad_new_forward": partial_grad_then_new_forward,
    "retain_graph": retain_graph,
    "double_backward": double_backward,
    "checkpoint_inside": checkpoint_inside,
    "grad_accumulation": gradient_accumulation,
    "inplace_after_save": in_place_after_save,
    "two_threads": two_threads,
}
