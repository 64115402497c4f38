# SPDX-License-Identifier: MIT
"""One rank of the 2-rank suites of test_distributed.py (not collected by
pytest: run as ``python dist_worker.py FAMILY RANK WORLD PORT LISTEN_FD
OUT_JSON``; rank 0 serves the store on LISTEN_FD, a socket its parent bound
to 127.0.0.1:PORT, so nothing listens beyond 127.0.0.1; the collectives
use the store alone).

For each model configuration of FAMILY ("ddp" or "fsdp2") the rank trains
the same model once without offloading (the reference) and once per
sync x place of backward (inside or outside ``with manager:``), all in this
one process, and compares losses, gradients and parameters bitwise against
the reference. It writes ``{case: "ok" or what differed}`` to OUT_JSON.
Every offloading run must offload something, and no saved tensor whose
storage is a parameter's (the module's parameters at the time of the pack:
FSDP2's unsharded parameters during forward, DTensor locals) may be among
the offloaded ones.
"""

import contextlib
import datetime
import functools
import json
import os
import re
import sys
import traceback

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import nn
from torch.nn import functional as F

import torch_offload
import torch_offload.sim

DELAY_US = 50
SYNCS = ("blocking", "streamed")
PLACES = ("inside", "outside")
STEPS = 3


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def bits(t):
    return local(t).detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def parameter_storages(model):
    """Storages of the module's parameters now (DTensor: its local tensor)."""
    out = set()
    for p in model.parameters():
        t = getattr(p, "_local_tensor", p)
        out.add(t.untyped_storage().data_ptr())
    return out


class Watch:
    """Wraps a Manager's pack hook: for each saved tensor it offloaded (its
    tensors_offloaded counter moved during that pack), records whether the
    storage is a parameter's of `model` at that moment."""

    def __init__(self, manager, model):
        self.parameter_hits = []
        pack = manager._pack

        def watched(tensor):
            before = manager.stats().tensors_offloaded
            handle = pack(tensor)
            if manager.stats().tensors_offloaded > before:
                if tensor.untyped_storage().data_ptr() in parameter_storages(model):
                    self.parameter_hits.append(tuple(tensor.shape))
            return handle

        manager._pack = watched


def positive_control(device):
    """The watch sees an offloaded storage that its model lists among its
    parameters: an activation (which the manager offloads) posing as one."""
    w = torch.randn(64, 64, device=device, requires_grad=True) * 2.0  # not a leaf
    x = torch.randn(8, 64, device=device, requires_grad=True)
    manager = torch_offload.Manager("sim", sync="blocking")
    watch = Watch(manager, type("Holder", (), {"parameters": lambda self: [w]})())
    with manager:
        y = x @ w  # saves w (for x's gradient)
    y.sum().backward()
    return len(watch.parameter_hits)


# ------------------------------------------------------------------ models

class Mlp(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                                    nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 8))

    def forward(self, x):
        return self.layers(x)


class Block(nn.Module):
    def __init__(self, width, ckpt):
        super().__init__()
        self.fc = nn.Linear(width, 2 * width)
        self.out = nn.Linear(2 * width, width)
        self.ckpt = ckpt

    def inner(self, x):
        return x + self.out(F.gelu(self.fc(x)))

    def forward(self, x):
        if self.ckpt:
            return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)
        return self.inner(x)


class Lm(nn.Module):
    def __init__(self, vocab=48, width=32, layers=3, tied=False, ckpt=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, ckpt) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        if tied:
            self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def mlp_batch(rank, step, micro, device):
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    return torch.randn(16, 32, generator=g).to(device), torch.randn(16, 8, generator=g).to(device)


def lm_batch(rank, step, device, vocab=48):
    g = torch.Generator().manual_seed(1000 * rank + step)
    idx = torch.randint(0, vocab, (4, 16), generator=g)
    return idx.to(device), torch.randint(0, vocab, (4, 16), generator=g).to(device)


# ------------------------------------------------------------------ runs

def ddp_run(config, device, manager, place, rank):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = DDP(Mlp().to(device), bucket_cap_mb=0.01, gradient_as_bucket_view=config.get("bucket_view", False),
                static_graph=config.get("static_graph", False))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    watch = Watch(manager, model) if manager else None
    record = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=False)
        micros = 2 if config.get("no_sync") else 1
        for micro in range(micros):
            x, y = mlp_batch(rank, step, micro, device)
            sync_ctx = model.no_sync() if micro + 1 < micros else contextlib.nullcontext()
            with sync_ctx:
                loss = forward_backward(lambda: F.mse_loss(model(x), y), manager, place)
            record.append(loss.detach())
        record += [p.grad.clone() for p in model.parameters()]
        opt.step()
    return record + [p.detach().clone() for p in model.parameters()], watch


def fsdp2_run(config, device, manager, place, rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    torch.manual_seed(0)
    model = Lm(tied=config.get("tied", False), ckpt=config.get("checkpoint", False)).to(device)
    if config.get("frozen"):
        model.blocks[1].requires_grad_(False)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs = {"mesh": mesh, "reshard_after_forward": config.get("reshard", True)}
    if config.get("bf16"):
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    for b in model.blocks:
        fully_shard(b, **kwargs)
    fully_shard(model, **kwargs)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    watch = Watch(manager, model) if manager else None
    record = []
    for step in range(STEPS):
        opt.zero_grad()
        idx, targets = lm_batch(rank, step, device)

        def loss_fn():
            logits = model(idx)
            return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))

        record.append(forward_backward(loss_fn, manager, place).detach())
        record += [local(p.grad).clone() for p in params]
        opt.step()
    return record + [local(p).detach().clone() for p in model.parameters()], watch


def forward_backward(loss_fn, manager, place):
    with manager if manager else contextlib.nullcontext():
        loss = loss_fn()
        if place == "inside":
            loss.backward()
    if place == "outside":
        loss.backward()
    return loss


CONFIGS = {
    "ddp": {
        "buckets_view_no_sync": {"bucket_view": True, "no_sync": True},
        "static_graph": {"static_graph": True},
    },
    "fsdp2": {
        "reshard": {"reshard": True},
        "no_reshard": {"reshard": False},
        "frozen_layer": {"frozen": True, "reshard": True},
        "frozen_layer_no_reshard": {"frozen": True, "reshard": False},
        "bf16_params": {"bf16": True},
        "checkpoint": {"checkpoint": True},
        "tied_embedding": {"tied": True},
    },
}


def compare(reference, got):
    if len(reference) != len(got):
        return f"{len(got)} tensors recorded, reference has {len(reference)}"
    for i, (a, b) in enumerate(zip(reference, got)):
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(bits(a), bits(b)):
            return f"tensor {i} of {len(got)} differs (shape {tuple(b.shape)}; first values {local(b).flatten()[:3]} " \
                   f"vs reference {local(a).flatten()[:3]})"
    return None


def run_family(family, rank, device):
    run = {"ddp": ddp_run, "fsdp2": fsdp2_run}[family]
    results = {}
    for name, config in CONFIGS[family].items():
        try:
            reference, _ = run(config, device, None, "outside", rank)
        except Exception:  # noqa: BLE001 (the case reports it)
            for sync in SYNCS:
                for place in PLACES:
                    results[f"{name}-{sync}-{place}"] = "reference run failed: " + traceback.format_exc(limit=3)
            continue
        for sync in SYNCS:
            for place in PLACES:
                key = f"{name}-{sync}-{place}"
                try:
                    manager = torch_offload.Manager("sim", sync=sync)
                    got, watch = run(config, device, manager, place, rank)
                    torch_offload.sim.synchronize()
                    stats = manager.stats()
                    problems = []
                    if stats.tensors_offloaded == 0:
                        problems.append("nothing was offloaded")
                    if watch.parameter_hits:
                        problems.append(f"parameter storages offloaded: {watch.parameter_hits[:4]}")
                    diff = compare(reference, got)
                    if diff:
                        problems.append(diff)
                    results[key] = "; ".join(problems) or "ok"
                except Exception:  # noqa: BLE001
                    results[key] = "raised: " + traceback.format_exc(limit=4)
    return results


def collective_rows():
    """The rows of docs/bad-input.md's collectives section: (call, message)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = open(os.path.join(root, "docs", "bad-input.md"), encoding="utf-8").read()
    section = text[text.index("## Collectives on sim"):]
    section = section[:section.index("\n## ")]
    return [tuple(re.findall(r"`([^`]*)`", line)) for line in section.splitlines() if line.startswith("| `")]


def unsupported_collectives(device):
    """Runs each row of collective_rows(); returns {call: the first line of
    its NotImplementedError, or what happened instead}."""
    out = {}
    for call, _ in collective_rows():
        scope = {"dist": dist, "x": torch.ones(4, device=device), "out": torch.empty(4, device=device)}
        try:
            eval(call, scope)
            out[call] = "did not raise"
        except NotImplementedError as e:
            out[call] = str(e).splitlines()[0]
        except Exception as e:  # noqa: BLE001
            out[call] = f"{type(e).__name__}: {e}"
    return out


def main(family, rank, world, port, listen_fd, out_path):
    torch.set_num_threads(1)
    torch_offload.sim.install(copy_latency_us=DELAY_US, poison_freed=True)
    device = torch.device("sim", rank % torch_offload.sim.config()["num_devices"])
    torch.get_device_module("sim").set_device(device.index)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60),
                          master_listen_fd=listen_fd if rank == 0 else None)
    dist.init_process_group(torch_offload.sim.collective_backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    keys_before = store.num_keys()
    results = {"positive_control": positive_control(device)}
    results.update(run_family(family, rank, device))
    if family == "ddp":
        results["unsupported"] = unsupported_collectives(device)
    dist.barrier()
    results["store_keys_grown"] = store.num_keys() - keys_before
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
