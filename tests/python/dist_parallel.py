# SPDX-License-Identifier: MIT
"""The model-parallel families of the distributed suites (run by
dist_worker.py): DTensor tensor and sequence parallel on 2 ranks
(``parallelize_module``, ``input_reshard``), FSDP2 x TP on a 2 x 2 mesh
(4 ranks), and torch.distributed.pipelining's GPipe, 1F1B and
Interleaved1F1B on 2 ranks.

A configuration with ``saves_dtensors`` saves DTensors for backward: with
offloading, some of them must be offloaded (through their local tensors).

Each run trains a small model for STEPS steps and returns what it recorded
(losses, then each step's gradients, then the final parameters, as this
rank holds them: DTensor locals, this rank's stages) for the bitwise
comparison, and each step's losses for the one-process check: the same
model unsharded, on one process, trained on the same data with the same
objective, must give the same losses up to rounding (the collectives are
right, not only the same with and without offloading)."""

import contextlib

import torch
from torch import nn
from torch.nn import functional as F

from dist_common import PLACES, STEPS, Watch, forward_backward

WIDTH = 32
HIDDEN = 64


# ------------------------------------------------------------------ models


class Mlp(nn.Module):
    """up (colwise) -> GELU -> down (rowwise)."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Attention(nn.Module):
    """Causal self-attention: q, k, v colwise (each rank holds whole heads),
    out rowwise. Heads are counted from the local width, so the same code
    runs sharded and unsharded."""

    def __init__(self, heads=4):
        super().__init__()
        self.head_dim = HIDDEN // heads
        self.q = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.k = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.v = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.out = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        b, t, _ = x.shape

        def heads(y):
            return y.view(b, t, -1, self.head_dim).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class NormBlock(nn.Module):
    """x + down(GELU(up(norm(x)))): the norm sequence parallel, up colwise
    from a sequence-sharded input, down rowwise back to one."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm(WIDTH)
        self.mlp = Mlp()

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class ResidualMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = Mlp()

    def forward(self, x):
        return x + self.mlp(x)


class Stack(nn.Module):
    def __init__(self, blocks, head=None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = head

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x) if self.head is not None else x


def mlp_plan(prefix=""):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {f"{prefix}up": ColwiseParallel(), f"{prefix}down": RowwiseParallel()}


def sequence_plan():
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        "norm": SequenceParallel(),
        "mlp.up": ColwiseParallel(input_layouts=Shard(1)),
        "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
    }


def attention_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "out": RowwiseParallel()}


# ------------------------------------------------------------------ data


def batch(step, group=0, shape=(4, 8)):
    """Input and target of `step` for data-parallel group `group` (ranks of
    one tensor-parallel group share their batch)."""
    g = torch.Generator().manual_seed(1000 * group + step)
    return torch.randn(*shape, WIDTH, generator=g), torch.randn(*shape, WIDTH, generator=g)


def shard_losses(out, target, shards, sequence):
    """The loss of each sequence shard (the shards' sum is the objective),
    or of the whole output."""
    if not sequence:
        return [F.mse_loss(out, target)]
    return [F.mse_loss(o, t) for o, t in zip(out.chunk(shards, 1), target.chunk(shards, 1), strict=True)]


def optimizer(params):
    # One parameter at a time: the foreach kernels refuse a list mixing
    # DTensors and plain tensors (input_reshard's model has both).
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=False)


# ------------------------------------------------------------------ tensor and sequence parallel (2 ranks)


def tp_model(config):
    """(the unsharded model, a function that parallelizes it on a 1-D mesh)."""
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.distributed.tensor.parallel.input_reshard import input_reshard

    kind = config["model"]
    torch.manual_seed(0)
    if kind == "mlp":
        model = Mlp()
        return model, lambda mesh: parallelize_module(model, mesh, mlp_plan())
    if kind == "attention":
        model = Attention()
        return model, lambda mesh: parallelize_module(model, mesh, attention_plan())
    if kind in ("layernorm", "rmsnorm"):
        norm = nn.LayerNorm if kind == "layernorm" else nn.RMSNorm
        model = Stack([NormBlock(norm), NormBlock(norm)])

        def parallelize(mesh):
            for b in model.blocks:
                parallelize_module(b, mesh, sequence_plan())

        return model, parallelize
    if kind == "input_reshard":
        # A replicated layer (plain parameters, offloaded as usual) before a
        # tensor-parallel block that saves its input sharded on dim 0.
        model = Stack([nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()), Mlp()])

        def parallelize(mesh):
            parallelize_module(model.blocks[1], mesh, mlp_plan())
            input_reshard(model.blocks[1], mesh, 0)

        return model, parallelize
    raise ValueError(f"tp model {kind!r}")


def tp_shape(config):
    return (8,) if config["model"] in ("mlp", "input_reshard") else (2, 8)


def tp_run(config, device, manager, place, rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    model, parallelize = tp_model(config)
    model.to(device)
    parallelize(init_device_mesh(device.type, (world,)))
    sequence = config.get("sequence", False)
    opt = optimizer(model.parameters())
    watch = Watch(manager, model) if manager else None
    record, losses = [], []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = (t.to(device) for t in batch(step, shape=tp_shape(config)))
        if sequence:  # this rank's part of the sequence
            x, y = x.chunk(world, 1)[rank].contiguous(), y.chunk(world, 1)[rank].contiguous()
        loss = forward_backward(lambda x=x, y=y: F.mse_loss(model(x), y), manager, place)
        losses.append(loss.item())
        record.append(loss.detach())
        record += [
            p.grad.to_local().clone() if hasattr(p.grad, "to_local") else p.grad.clone() for p in model.parameters()
        ]
        opt.step()
    return record + [p.detach().clone() for p in model.parameters()], watch, losses


def tp_serial(config, device, rank, world):
    model, _ = tp_model(config)
    model.to(device)
    sequence = config.get("sequence", False)
    opt = optimizer(model.parameters())
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = (t.to(device) for t in batch(step, shape=tp_shape(config)))
        parts = shard_losses(model(x), y, world, sequence)
        sum(parts).backward()
        losses.append(parts[rank if sequence else 0].item())
        opt.step()
    return losses


# ------------------------------------------------------------------ FSDP2 x TP (4 ranks, 2 x 2 mesh)


def fsdp2_tp_model(config):
    torch.manual_seed(0)
    if config["model"] == "mlp":
        return Stack([ResidualMlp(), ResidualMlp()], head=nn.Linear(WIDTH, WIDTH))
    return Stack([NormBlock(nn.LayerNorm), NormBlock(nn.LayerNorm)])


def fsdp2_tp_run(config, device, manager, place, rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(device.type, (2, world // 2), mesh_dim_names=("dp", "tp"))
    model = fsdp2_tp_model(config).to(device)
    sequence = config["model"] == "sequence_parallel"
    for b in model.blocks:
        parallelize_module(b, mesh["tp"], sequence_plan() if sequence else mlp_plan("mlp."))
        fully_shard(b, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = optimizer(model.parameters())
    watch = Watch(manager, model) if manager else None
    dp, tp, tp_size = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank(), mesh["tp"].size()
    record, losses = [], []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = (t.to(device) for t in batch(step, group=dp, shape=(2, 8)))
        if sequence:
            x, y = x.chunk(tp_size, 1)[tp].contiguous(), y.chunk(tp_size, 1)[tp].contiguous()
        loss = forward_backward(lambda x=x, y=y: F.mse_loss(model(x), y), manager, place)
        losses.append(loss.item())
        record.append(loss.detach())
        record += [p.grad.to_local().clone() for p in model.parameters()]
        opt.step()
    return record + [p.to_local().detach().clone() for p in model.parameters()], watch, losses


def fsdp2_tp_serial(config, device, rank, world):
    """FSDP2 averages gradients over the data-parallel groups; the tensor-
    parallel ranks of one group share its batch."""
    model = fsdp2_tp_model(config).to(device)
    sequence = config["model"] == "sequence_parallel"
    dp_size, tp_size = 2, world // 2
    dp, tp = rank // tp_size, rank % tp_size
    opt = optimizer(model.parameters())
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        mine = None
        total = 0
        for group in range(dp_size):
            x, y = (t.to(device) for t in batch(step, group=group, shape=(2, 8)))
            parts = shard_losses(model(x), y, tp_size, sequence)
            total = total + sum(parts) / dp_size
            if group == dp:
                mine = parts[tp if sequence else 0].item()
        total.backward()
        losses.append(mine)
        opt.step()
    return losses


# ------------------------------------------------------------------ pipelining (2 ranks)

MICROBATCHES = 4


def pipeline_stages(count):
    torch.manual_seed(0)
    return [
        nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH), nn.Tanh()) for _ in range(count)
    ]


def stages_per_rank(config):
    return 2 if config["schedule"] == "interleaved" else 1


@contextlib.contextmanager
def stage_forwards_under(manager, modules):
    """Opens `manager` around each forward of each module (a forward pre-hook
    enters, a forward hook that also runs on an exception exits)."""

    def enter(*_):
        manager.__enter__()  # returns None: a pre-hook's value would replace the input

    def leave(*_):
        manager.__exit__(None, None, None)

    handles = []
    for m in modules:
        handles.append(m.register_forward_pre_hook(enter))
        handles.append(m.register_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def pipeline_run(config, device, manager, place, rank, world):
    """place "step": ``with manager:`` around each ``schedule.step`` (every
    micro-batch's forward, loss and backward run inside); "stage_forward":
    around each forward of this rank's stage modules only."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    per = stages_per_rank(config)
    count = per * world
    every = pipeline_stages(count)
    mine = [rank + k * world for k in range(per)]  # interleaved: rank r holds stages r, r + world, ...
    modules = nn.ModuleList(every[i].to(device) for i in mine)
    stages = [PipelineStage(m, i, count, device) for m, i in zip(modules, mine, strict=True)]
    schedule_type = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}
    schedule = schedule_type[config["schedule"]](
        stages if per > 1 else stages[0], n_microbatches=MICROBATCHES, loss_fn=F.mse_loss
    )
    first, last = 0 in mine, count - 1 in mine
    opt = optimizer(modules.parameters())
    watch = Watch(manager, modules) if manager else None
    record, losses = [], []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = (t.to(device) for t in batch(step, shape=(32,)))
        micro = []
        args = (x,) if first else ()
        target = y if last else None
        if manager is None:
            schedule.step(*args, target=target, losses=micro)
        elif place == "step":
            with manager:
                schedule.step(*args, target=target, losses=micro)
        else:
            with stage_forwards_under(manager, modules):
                schedule.step(*args, target=target, losses=micro)
        losses += [m.item() for m in micro]
        record += [m.detach() for m in micro]
        record += [p.grad.clone() for p in modules.parameters()]
        opt.step()
    return record + [p.detach().clone() for p in modules.parameters()], watch, losses


def pipeline_serial(config, device, rank, world):
    """The stages in order on one process; each step's loss is the mean of
    the micro-batches' (what the schedules scale the gradients by). Only the
    rank of the last stage records losses."""
    count = stages_per_rank(config) * world
    model = nn.Sequential(*pipeline_stages(count)).to(device)
    opt = optimizer(model.parameters())
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = (t.to(device) for t in batch(step, shape=(32,)))
        micro = [F.mse_loss(model(xs), ys) for xs, ys in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES), strict=True)]
        (sum(micro) / MICROBATCHES).backward()
        losses += [m.item() for m in micro]
        opt.step()
    return losses if rank == (count - 1) % world else []


# ------------------------------------------------------------------ families

FAMILIES = {
    "tp": {
        "run": tp_run,
        "serial": tp_serial,
        "places": PLACES,
        "world": 2,
        "configs": {
            "mlp": {"model": "mlp", "saves_dtensors": True},
            "attention": {"model": "attention", "saves_dtensors": True},
            "sequence_layernorm": {"model": "layernorm", "sequence": True, "saves_dtensors": True},
            "sequence_rmsnorm": {"model": "rmsnorm", "sequence": True, "saves_dtensors": True},
            # input_reshard's hooks take every saved tensor of the block: the
            # manager sees only the replicated layer's plain tensors.
            "input_reshard": {"model": "input_reshard"},
        },
    },
    "fsdp2_tp": {
        "run": fsdp2_tp_run,
        "serial": fsdp2_tp_serial,
        "places": ("outside",),
        "world": 4,
        "configs": {
            "mlp": {"model": "mlp", "saves_dtensors": True},
            "sequence_parallel": {"model": "sequence_parallel", "saves_dtensors": True},
        },
    },
    "pipeline": {
        "run": pipeline_run,
        "serial": pipeline_serial,
        "places": ("step", "stage_forward"),
        "world": 2,
        "configs": {
            "gpipe": {"schedule": "gpipe"},
            "1f1b": {"schedule": "1f1b"},
            "interleaved": {"schedule": "interleaved"},
        },
    },
}
