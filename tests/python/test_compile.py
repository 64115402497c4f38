# SPDX-License-Identifier: MIT
"""Offloading the activations that torch.compile regions and custom
autograd Functions save, on the test device (OFFLOAD_TEST_DEVICE; sim by
default, slow and poisoned: conftest.py).

AOTAutograd runs a compiled forward with grad mode off, and a custom
Function's forward runs that way too, so what they save for backward are
leaves that do not require grad: activations all the same, which the
manager must offload (DESIGN.md section 13). Each case trains the GPT of
gpt.py (2 layers, width 64) for two AdamW steps, compiled per block
(regional compilation) or as a whole, with backend aot_eager (and inductor
on cuda), and checks: losses, gradients and final parameters bitwise equal
to the same compiled model without the manager; the compiled code really
ran (a region's output comes from a compiled graph); the bytes offloaded
while the compiled regions ran are at least 0.9x those of the same modules
in eager mode, and never more than the activations the regions saved
(parameters stay). Also a custom Function that saves the statistic and the
normalized input it computed, and torch.utils.checkpoint inside compiled
blocks. Each compiled model is built once per module and shared by the
Blocking and Streamed cases; its reference run (the first call, which
compiles) happens in the fixture."""

import contextlib
import os

import pytest
import torch
import torch.utils.checkpoint
from torch import nn
from torch.nn import functional as F

import gpt
import testdevice
import torch_offload
from test_torch_offload import assert_bitwise

DEV = f"{testdevice.DEV}:0"
SYNCS = ["blocking", "streamed"]
# Inductor generates kernels for cuda here; for sim it has no code generator.
# OFFLOAD_TEST_INDUCTOR=0: left out (scripts/gpu-check sets it where Triton
# cannot compile a one-op kernel without the manager: the toolkit's fault).
INDUCTOR = testdevice.DEV == "cuda" and os.environ.get("OFFLOAD_TEST_INDUCTOR", "1") != "0"
BACKENDS = ["aot_eager"] + (["inductor"] if INDUCTOR else [])
SHAPE = {"layers": 2, "width": 64, "heads": 4, "seq": 32}
BATCH = 2
STEPS = 2
MIN_OFFLOAD_BYTES = 1024  # the Manager's default
MIN_RATIO = 0.9  # bytes offloaded in compiled regions / bytes offloaded by the same modules in eager mode


def from_compiled_graph(out):
    """Whether `out` was produced by an AOTAutograd graph: its autograd
    node, or a view node above it (the graph's outputs that are views are
    replayed as views outside it), is CompiledFunctionBackward."""
    node = out.grad_fn
    for _ in range(4):
        if node is None:
            return False
        if type(node).__name__ == "CompiledFunctionBackward":
            return True
        node = node.next_functions[0][0] if node.next_functions else None
    return False


class Regions:
    """Forward hooks around the modules a test calls its regions (the
    compiled modules, or the same modules in eager mode). While one runs:
    the bytes the open manager offloads (Stats.bytes_offloaded is counted
    when a tensor is packed), and with probe() the bytes of the distinct
    activation storages saved on the device (not a parameter's storage, at
    least min_offload_bytes). Also counts the calls whose output came from
    a compiled graph."""

    def __init__(self, modules, params):
        self.manager = None
        self.bytes_offloaded = 0
        self.calls = 0
        self.compiled_calls = 0
        self._param_storages = {p.untyped_storage()._cdata for p in params}
        self._inside = False
        self._start = 0
        self._saved = None
        for m in modules:
            m.register_forward_pre_hook(self._enter)
            m.register_forward_hook(self._leave)

    def _enter(self, module, args):
        assert not self._inside, "regions do not nest"
        self._inside = True
        self._start = self.manager.stats().bytes_offloaded if self.manager else 0

    def _leave(self, module, args, out):
        self._inside = False
        if self.manager:
            self.bytes_offloaded += self.manager.stats().bytes_offloaded - self._start
        self.calls += 1
        self.compiled_calls += from_compiled_graph(out)

    @contextlib.contextmanager
    def probe(self, min_offload_bytes):
        """saved_tensors_hooks that change nothing and note the activation
        storages saved inside the regions; yields a dict storage -> bytes."""
        saved = {}

        def pack(t):
            if self._inside and t.device.type == testdevice.DEV:
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self._param_storages and storage.nbytes() >= min_offload_bytes:
                    saved[key] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield saved


class CheckpointedBlock(gpt.Block):
    """A gpt.Block whose forward runs under non-reentrant torch.utils.checkpoint."""

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(super().forward, x, use_reentrant=False)


class Subject:
    """One GPT, in one of the modes: "eager"; "blocks" (each block
    compiled); "whole" (the model compiled); "checkpoint" (each block
    checkpointed, then compiled). `forward` is what a step calls,
    `regions` watches the compiled modules (in eager mode: `blocks` the
    blocks, `whole` the model)."""

    def __init__(self, mode, backend=None):
        self.mode = mode
        self.model = gpt.make(DEV, **SHAPE)
        if mode == "checkpoint":
            for i, block in enumerate(self.model.blocks):
                self.model.blocks[i] = CheckpointedBlock(SHAPE["width"], SHAPE["heads"]).to(DEV)
                self.model.blocks[i].load_state_dict(block.state_dict())
        self.params = list(self.model.parameters())
        self.initial = [p.detach().clone() for p in self.params]
        self.idx, self.targets = gpt.batch(DEV, batch_size=BATCH, seq=SHAPE["seq"])
        self.forward = self.model
        if mode == "eager":
            self.regions = {
                "blocks": Regions(self.model.blocks, self.params),
                "whole": Regions([self.model], self.params),
            }
            return
        if mode == "whole":
            self.forward = torch.compile(self.model, backend=backend, fullgraph=True)
            watched = [self.forward]
        else:
            for i, block in enumerate(self.model.blocks):
                self.model.blocks[i] = torch.compile(block, backend=backend, fullgraph=True)
            watched = list(self.model.blocks)
        self.regions = {mode: Regions(watched, self.params)}

    def train(self, manager=None, regions=()):
        """Losses and gradients of each step, then the final parameters, of
        STEPS AdamW steps from the initial parameters, forward and loss
        inside `with manager` (when given); `regions` (names) get the
        manager."""
        with torch.no_grad():
            for p, p0 in zip(self.params, self.initial, strict=True):
                p.copy_(p0)
        optimizer = torch.optim.AdamW(self.params, lr=1e-2)
        for name in regions:
            self.regions[name].manager = manager
        out = []
        try:
            for _ in range(STEPS):
                optimizer.zero_grad()
                with manager if manager is not None else contextlib.nullcontext():
                    logits = self.forward(self.idx)
                    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), self.targets.reshape(-1))
                loss.backward()
                out += [loss.detach().clone()] + [p.grad.clone() for p in self.params]
                optimizer.step()
        finally:
            for name in regions:
                self.regions[name].manager = None
        out += [p.detach().clone() for p in self.params]
        for p in self.params:
            p.grad = None
        testdevice.synchronize(0)
        return out

    def saved_activation_bytes(self, region, min_offload_bytes):
        """Bytes of the distinct activation storages the region saves in one
        forward (the probe's count), after a forward and backward without
        the manager (gradients cleared after)."""
        with self.regions[region].probe(min_offload_bytes) as saved:
            logits = self.forward(self.idx)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), self.targets.reshape(-1))
        loss.backward()
        for p in self.params:
            p.grad = None
        return sum(saved.values())


@pytest.fixture(scope="module")
def eager():
    """The eager GPT and, per sync policy, what its blocks and the whole
    model offloaded under a manager in STEPS steps."""
    subject = Subject("eager")
    subject.offloaded = {}
    for sync in SYNCS:
        for region in subject.regions.values():
            region.bytes_offloaded = 0
        manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=MIN_OFFLOAD_BYTES)
        subject.train(manager, regions=("blocks", "whole"))
        subject.offloaded[sync] = {name: r.bytes_offloaded for name, r in subject.regions.items()}
    return subject


@pytest.fixture(
    scope="module",
    params=[(mode, backend) for mode in ("blocks", "whole", "checkpoint") for backend in BACKENDS],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def compiled(request):
    """A compiled GPT, its reference run (no manager; the first call
    compiles) and the activation bytes its regions save per forward."""
    mode, backend = request.param
    subject = Subject(mode, backend)
    subject.reference = subject.train()
    subject.saved_bytes = subject.saved_activation_bytes(mode, MIN_OFFLOAD_BYTES)
    yield subject
    torch._dynamo.reset()  # frees the compiled code and its caches before the next subject


@pytest.mark.parametrize("sync", SYNCS)
def test_compiled_training_offloads_and_is_bitwise(compiled, eager, sync):
    mode = compiled.mode
    region = compiled.regions[mode]
    region.calls = region.compiled_calls = region.bytes_offloaded = 0
    manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=MIN_OFFLOAD_BYTES)
    got = compiled.train(manager, regions=(mode,))
    assert_bitwise(compiled.reference, got)
    assert region.calls > 0 and region.compiled_calls == region.calls, (region.calls, region.compiled_calls)
    stats = manager.stats()
    assert stats.tensors_offloaded > 0 and stats.bytes_reloaded + stats.stash_reuses > 0, stats
    assert stats.passed_leaf > 0, stats  # the parameters the regions save stay
    inside = region.bytes_offloaded
    # Everything the compiled regions saved that is an activation, and
    # nothing else (a parameter's storage would add its bytes).
    assert MIN_RATIO * STEPS * compiled.saved_bytes <= inside <= STEPS * compiled.saved_bytes, (
        inside,
        compiled.saved_bytes,
    )
    if mode == "checkpoint":
        # Only the blocks' inputs: the checkpointed blocks are recomputed in backward.
        block_input = BATCH * SHAPE["seq"] * SHAPE["width"] * 4
        assert inside == STEPS * SHAPE["layers"] * block_input, (inside, block_input)
        assert inside < MIN_RATIO * eager.offloaded[sync]["blocks"]  # positive control: checkpoint saved less
    else:
        assert inside >= MIN_RATIO * eager.offloaded[sync][mode], (inside, eager.offloaded[sync])


# ---------------------------------------------------------------- a custom autograd Function


class FusedRMSNormFunction(torch.autograd.Function):
    """y = x * rsqrt(mean(x^2) + eps) * weight over the last dimension, one
    fused op: it saves what it computed (the normalized input and the
    reciprocal RMS per row), not its input."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = (x * x).mean(-1, keepdim=True).add(eps).rsqrt()
        xhat = x * rstd
        ctx.save_for_backward(xhat, rstd, weight)
        return xhat * weight

    @staticmethod
    def backward(ctx, grad):
        xhat, rstd, weight = ctx.saved_tensors
        g = grad * weight
        grad_x = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        grad_weight = (grad * xhat).reshape(-1, xhat.size(-1)).sum(0)
        return grad_x, grad_weight, None


class FusedRMSNorm(nn.Module):
    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return FusedRMSNormFunction.apply(x, self.weight, self.eps)


class NormLM(nn.Module):
    def __init__(self, vocab=96, width=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.norm = FusedRMSNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx):
        return self.head(self.norm(self.tok(idx)))


@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("compiled_norm", [False, True], ids=["eager", "compiled"])
def test_custom_function_intermediates_are_offloaded(sync, compiled_norm):
    batch, seq, width = 4, 64, 64
    torch.manual_seed(0)
    model = NormLM(width=width).to(DEV)
    if compiled_norm:
        model.norm = torch.compile(model.norm, backend="aot_eager", fullgraph=True)
    params = list(model.parameters())
    initial = [p.detach().clone() for p in params]
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 96, (batch, seq + 1), generator=g)
    idx, targets = data[:, :-1].to(DEV), data[:, 1:].to(DEV)
    region = Regions([model.norm], params)

    def train(manager):
        with torch.no_grad():
            for p, p0 in zip(params, initial, strict=True):
                p.copy_(p0)
        optimizer = torch.optim.AdamW(params, lr=1e-2)
        region.manager = manager
        out = []
        for _ in range(STEPS):
            optimizer.zero_grad()
            with manager if manager is not None else contextlib.nullcontext():
                loss = F.cross_entropy(model(idx).reshape(-1, 96), targets.reshape(-1))
            loss.backward()
            out += [loss.detach().clone()] + [p.grad.clone() for p in params]
            optimizer.step()
        region.manager = None
        out += [p.detach().clone() for p in params]
        for p in params:
            p.grad = None
        testdevice.synchronize(0)
        return out

    # With the manager first: the compiled variant compiles inside `with manager`
    # (saved-tensor hooks are off while Dynamo and AOTAutograd trace).
    manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=0)
    got = train(manager)
    reference = train(None)
    assert_bitwise(reference, got)
    assert region.calls == 2 * STEPS, region.calls
    assert region.compiled_calls == (region.calls if compiled_norm else 0), region.compiled_calls
    # The normalized input (batch x seq x width) and the statistic (batch x seq), in float32.
    intermediates = (batch * seq * width + batch * seq) * 4
    stats = manager.stats()
    if compiled_norm:
        # The partitioner chooses what the graph saves; all of it but the weight is an activation.
        assert region.bytes_offloaded >= MIN_RATIO * STEPS * intermediates, (region.bytes_offloaded, stats)
    else:
        assert region.bytes_offloaded == STEPS * intermediates, (region.bytes_offloaded, stats)
    assert stats.passed_leaf >= STEPS, stats  # the weight the Function saves stays
