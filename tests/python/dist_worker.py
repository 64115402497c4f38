# SPDX-License-Identifier: MIT
"""One rank of the distributed suites of test_distributed.py (not collected
by pytest: run as ``python dist_worker.py FAMILY RANK WORLD PORT LISTEN_FD
OUT_JSON``; rank 0 serves the store on LISTEN_FD, a socket its parent bound
to 127.0.0.1:PORT, so nothing listens beyond 127.0.0.1; the collectives
use the store alone).

For each model configuration of FAMILY (FAMILIES: "ddp" and "fsdp2" here,
the model-parallel ones in dist_parallel.py) the rank first trains the
model once without offloading (the reference) per configuration, then once
per sync x place of backward, all in this one process, and compares losses,
gradients and parameters bitwise against the reference. It writes
``{case: "ok" or what differed}`` to OUT_JSON after every case (so a rank
that dies leaves the verdicts it reached). Every offloading run must
offload something, and no saved tensor whose storage is a parameter's (the
module's parameters at the time of the pack: FSDP2's unsharded parameters
during forward, DTensor locals) may be among the offloaded ones. A family
with a one-process check also requires each reference run's losses to be
those of the same model trained unsharded in one process, up to rounding.
"""

import contextlib
import datetime
import faulthandler
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

import dist_parallel
import torch_offload
import torch_offload.sim
from dist_common import PLACES, STEPS, SYNCS, Watch, compare, forward_backward, local

DELAY_US = 50
SERIAL_RTOL = 1e-4


def note_stats(family, key, rank, stats, watch):
    """With OFFLOAD_DIST_STATS=FILE: appends what a case offloaded on this
    rank (for reports; the verdicts do not depend on it)."""
    path = os.environ.get("OFFLOAD_DIST_STATS")
    if path:
        with open(f"{path}.{rank}", "a", encoding="utf-8") as out:
            out.write(
                f"{family} {key} tensors_offloaded={stats.tensors_offloaded} "
                f"bytes_offloaded={stats.bytes_offloaded} subclass_offloads={watch.subclass_offloads}\n"
            )


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
        self.layers = nn.Sequential(
            nn.Linear(32, width),
            nn.GELU(),
            nn.Linear(width, width),
            nn.GELU(),
            nn.Linear(width, width),
            nn.Tanh(),
            nn.Linear(width, 8),
        )

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


def ddp_run(config, device, manager, place, rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(
        Mlp().to(device),
        bucket_cap_mb=0.01,
        gradient_as_bucket_view=config.get("bucket_view", False),
        static_graph=config.get("static_graph", False),
    )
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
                loss = forward_backward(lambda x=x, y=y: F.mse_loss(model(x), y), manager, place)
            record.append(loss.detach())
        record += [p.grad.clone() for p in model.parameters()]
        opt.step()
    return record + [p.detach().clone() for p in model.parameters()], watch, None


def fsdp2_run(config, device, manager, place, rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = Lm(tied=config.get("tied", False), ckpt=config.get("checkpoint", False)).to(device)
    if config.get("frozen"):
        model.blocks[1].requires_grad_(False)
    mesh = init_device_mesh(device.type, (world,))
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

        def loss_fn(idx=idx, targets=targets):
            logits = model(idx)
            return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))

        record.append(forward_backward(loss_fn, manager, place).detach())
        record += [local(p.grad).clone() for p in params]
        opt.step()
    return record + [local(p).detach().clone() for p in model.parameters()], watch, None


FAMILIES = {
    "ddp": {
        "run": ddp_run,
        "places": PLACES,
        "world": 2,
        "configs": {
            "buckets_view_no_sync": {"bucket_view": True, "no_sync": True},
            "static_graph": {"static_graph": True},
        },
    },
    "fsdp2": {
        "run": fsdp2_run,
        "places": PLACES,
        "world": 2,
        "configs": {
            "reshard": {"reshard": True},
            "no_reshard": {"reshard": False},
            "frozen_layer": {"frozen": True, "reshard": True},
            "frozen_layer_no_reshard": {"frozen": True, "reshard": False},
            "bf16_params": {"bf16": True},
            "checkpoint": {"checkpoint": True},
            "tied_embedding": {"tied": True},
        },
    },
    **dist_parallel.FAMILIES,
}


def cases(family):
    """The offloading cases of `family`: CONFIG-SYNC-PLACE."""
    spec = FAMILIES[family]
    return [f"{name}-{sync}-{place}" for name in spec["configs"] for sync in SYNCS for place in spec["places"]]


def serial_difference(serial, losses):
    if len(serial) != len(losses):
        return f"{len(losses)} losses recorded, the one-process run has {len(serial)}"
    for i, (a, b) in enumerate(zip(serial, losses, strict=True)):
        if abs(a - b) > SERIAL_RTOL * max(abs(a), abs(b), 1e-3):
            return f"loss {i} is {b!r}, the one-process run's {a!r}"
    return None


def run_family(family, rank, world, device, report):
    """Runs every case of `family`; report(key, verdict) after each."""
    spec = FAMILIES[family]
    run = spec["run"]
    references = {}
    for name, config in spec["configs"].items():
        try:
            references[name], _, losses = run(config, device, None, "outside", rank, world)
            verdict = "ok"
            if "serial" in spec:
                verdict = serial_difference(spec["serial"](config, device, rank, world), losses) or "ok"
        except Exception:  # noqa: BLE001 (the case reports it)
            verdict = "reference run failed: " + traceback.format_exc(limit=4)
        report(f"{name}-reference", verdict)
    for name, config in spec["configs"].items():
        for sync in SYNCS:
            for place in spec["places"]:
                key = f"{name}-{sync}-{place}"
                if name not in references:
                    report(key, "reference run failed (see the reference case)")
                    continue
                try:
                    manager = torch_offload.Manager("sim", sync=sync)
                    got, watch, _ = run(config, device, manager, place, rank, world)
                    torch_offload.sim.synchronize()
                    stats = manager.stats()
                    problems = []
                    if stats.tensors_offloaded == 0:
                        problems.append("nothing was offloaded")
                    if config.get("saves_dtensors") and watch.subclass_offloads == 0:
                        problems.append("no saved DTensor was offloaded")
                    if watch.parameter_hits:
                        problems.append(f"parameter storages offloaded: {watch.parameter_hits[:4]}")
                    diff = compare(references[name], got)
                    if diff:
                        problems.append(diff)
                    note_stats(family, key, rank, stats, watch)
                    report(key, "; ".join(problems) or "ok")
                except Exception:  # noqa: BLE001
                    report(key, "raised: " + traceback.format_exc(limit=4))


def collective_rows():
    """The rows of docs/bad-input.md's collectives section: (call, message)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = open(os.path.join(root, "docs", "bad-input.md"), encoding="utf-8").read()
    section = text[text.index("## Collectives on sim") :]
    section = section[: section.index("\n## ")]
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
    faulthandler.enable()  # a crash prints where it happened (the suite shows the end of the output)
    torch.set_num_threads(1)
    torch_offload.sim.install(copy_latency_us=DELAY_US, poison_freed=True)
    device = torch.device("sim", rank % torch_offload.sim.config()["num_devices"])
    torch.get_device_module("sim").set_device(device.index)
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world,
        rank == 0,
        timeout=datetime.timedelta(seconds=60),
        master_listen_fd=listen_fd if rank == 0 else None,
    )
    dist.init_process_group(
        torch_offload.sim.collective_backend,
        store=store,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    keys_before = store.num_keys()
    results = {}

    def report(key, verdict):
        results[key] = verdict
        with open(out_path + ".part", "w") as f:
            json.dump(results, f)
        os.replace(out_path + ".part", out_path)

    report("positive_control", positive_control(device))
    run_family(family, rank, world, device, report)
    if family == "ddp":
        report("unsupported", unsupported_collectives(device))
    dist.barrier()
    report("store_keys_grown", store.num_keys() - keys_before)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
