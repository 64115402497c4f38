# SPDX-License-Identifier: MIT
"""torch_offload.CheckpointOffload as a Hugging Face gradient_checkpointing_func:
a tiny model built from torch.nn modules that calls its layers the way
transformers' GradientCheckpointingLayer does, on the test device
(OFFLOAD_TEST_DEVICE; sim by default, slow and poisoned: conftest.py).
Bitwise parity with torch.utils.checkpoint without offloading (dropout on),
only the layers' inputs reach the manager, and a lower peak of device
memory. transformers' own models: tests/thirdparty/test_checkpoint_hf.py."""

import contextlib
import copy
import functools
import io
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import testdevice
import torch_offload

DEV = f"{testdevice.DEV}:0"


class Layer(nn.Module):
    """One decoder-like layer: called as layer(hidden_states, attention_mask=...)."""

    def __init__(self, width):
        super().__init__()
        self.gradient_checkpointing = False  # what _set_gradient_checkpointing looks for
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(0.2)

    def __call__(self, *args, **kwargs):
        # transformers.modeling_layers.GradientCheckpointingLayer.__call__
        if self.gradient_checkpointing and self.training:
            return self._gradient_checkpointing_func(functools.partial(super().__call__, **kwargs), *args)
        return super().__call__(*args, **kwargs)

    def forward(self, hidden_states, attention_mask=None):
        h = self.drop(self.down(F.gelu(self.up(self.norm(hidden_states)))))
        if attention_mask is not None:
            h = h * attention_mask
        return hidden_states + h


class TinyLM(nn.Module):
    def __init__(self, vocab=64, width=64, layers=6, by_keyword=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Layer(width) for _ in range(layers))
        self.head = nn.Linear(width, vocab)
        self.by_keyword = by_keyword  # layer(hidden_states=h, ...), as some Hugging Face models call them

    def forward(self, input_ids, labels):
        h = self.embed(input_ids)
        mask = torch.ones(h.shape[:2] + (1,), device=h.device)
        for layer in self.layers:
            h = layer(hidden_states=h, attention_mask=mask) if self.by_keyword else layer(h, attention_mask=mask)
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def train(func, steps=3, layers=6, width=64, seq=32, scope=None, by_keyword=False):
    """Losses, last gradients, the device peak above what was allocated
    before, and the layers' checkpoint function, of `steps` AdamW steps with
    each layer checkpointed by `func` (None: no checkpoint; "offload":
    enable_gradient_checkpointing with a streamed manager), each forward
    inside `with scope:` when one is given."""
    testdevice.warm_up()
    base = testdevice.device_bytes(0)
    torch.manual_seed(0)
    model = TinyLM(width=width, layers=layers, by_keyword=by_keyword).to(DEV).train()
    if func == "offload":
        torch_offload.enable_gradient_checkpointing(model, torch_offload.Manager(DEV, sync="streamed", max_fwd_stash=1))
    elif func is not None:
        for module in model.modules():
            if isinstance(module, Layer):
                module._gradient_checkpointing_func = func
                module.gradient_checkpointing = True
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 64, (8, seq + 1), generator=g)
    ids, labels = data[:, :-1].to(DEV), data[:, 1:].to(DEV)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    testdevice.synchronize(0)
    testdevice.reset_peak(0)
    for _ in range(steps):
        optimizer.zero_grad()
        if scope is not None:  # the step a PlannedCheckpoint's plan counts blocks in
            with scope:
                loss = model(ids, labels)
        else:
            loss = model(ids, labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    testdevice.synchronize(0)
    peak = testdevice.peak_bytes(0) - base
    grads = [p.grad.cpu() for p in model.parameters()]
    return losses, grads, peak, model.layers[0]._gradient_checkpointing_func if func else None


def assert_same(a, b):
    assert a[0] == b[0]
    assert all(torch.equal(x, y) for x, y in zip(a[1], b[1], strict=True))


@pytest.mark.parametrize("sync", ["streamed", "blocking"])
def test_bitwise_parity_with_torch_checkpoint_and_only_layer_inputs_offloaded(sync):
    plain = train(torch_offload.plain_checkpoint)
    manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=0)
    got = train(torch_offload.CheckpointOffload(manager))
    assert_same(plain, got)
    assert_same(train(None), got)  # and with no checkpoint at all
    stats = manager.stats()
    # on the device: each layer's hidden_states, nothing the layers save (torch.utils.checkpoint
    # also saves one CPU tensor per call, which stays where it is)
    assert stats.tensors_seen - stats.passed_other_device == 3 * 6, stats
    assert stats.tensors_offloaded == 3 * 6, stats
    assert stats.bytes_offloaded == 3 * 6 * 8 * 32 * 64 * 4, stats
    assert stats.tensors_reloaded + stats.stash_reuses == 3 * 6, stats


def test_enable_gradient_checkpointing_offloads_through_streamed_and_lowers_the_peak():
    # Many narrow layers on long sequences: the layers' inputs, not one
    # layer's recomputation, are what checkpointing alone keeps at its peak.
    shape = {"steps": 2, "layers": 24, "width": 32, "seq": 256}
    plain = train(torch_offload.plain_checkpoint, **shape)
    got = train("offload", **shape)
    assert_same(plain, got)
    func = got[3]
    assert isinstance(func, torch_offload.CheckpointOffload)
    assert "streamed" in repr(func)
    assert func.manager.stats().tensors_offloaded == 2 * 24
    assert got[2] < plain[2], (got[2], plain[2])


def test_bad_input():
    with pytest.raises(ValueError, match="use_reentrant must be False"):
        torch_offload.CheckpointOffload(use_reentrant=True)
    with pytest.raises(TypeError, match="manager must be a torch_offload.Manager, got str"):
        torch_offload.CheckpointOffload("sim")


@pytest.mark.parametrize("sync", ["streamed", "blocking"])
@pytest.mark.parametrize("fraction", [0.8, 4.0])
def test_planned_checkpoint_is_bitwise_and_plans_every_layer(sync, fraction):
    plain_peak = train(None, steps=1)[2]
    none = train(None, steps=4)
    testdevice.warm_up()  # the target counts what is allocated before the model too (on CUDA cuBLAS's workspaces)
    start = testdevice.device_bytes(0)
    manager = torch_offload.Manager(DEV, sync=sync, device_target_bytes=start + int(fraction * plain_peak) + (1 << 20))
    planned = torch_offload.PlannedCheckpoint(manager)
    got = train(planned, steps=4, scope=manager)
    assert_same(none, got)
    stats = manager.stats()
    # the last step's choices cover the six layers; the first step measured them all
    assert stats.blocks_kept + stats.blocks_offloaded + stats.blocks_recomputed == 6, stats
    summary = planned.summary()
    assert summary.count("\nblock ") == 6 and "saves" in summary, summary
    # the measuring step recorded where each recomputation began, and its time
    assert "backward peak -1" not in summary and "recomputed in -1" not in summary, summary
    # what the model saves outside its layers (the head's and the loss's tensors) was measured in step 1
    outside = summary.split("outside blocks: ")[1].split("\n")[0]
    assert not outside.startswith("0 B"), summary
    if fraction > 1:  # everything fits: every layer kept, and what is saved outside them
        assert stats.blocks_kept == 6, summary
        assert outside.endswith(": keep"), summary


@pytest.mark.parametrize("plan", [False, True])
def test_a_layer_given_its_input_by_keyword_has_it_measured_and_offloaded(plan):
    # layer(hidden_states=h, ...) reaches the checkpoint function as
    # partial(forward, hidden_states=h, ...) with no positional argument:
    # the input goes through the manager all the same (checkpoint saves it).
    none = train(None, steps=3, by_keyword=True)
    if plan:  # a target only recomputing (or offloading) layers meets
        plain_peak = train(None, steps=1)[2]
        testdevice.warm_up()
        target = testdevice.device_bytes(0) + int(0.5 * plain_peak)
        manager = torch_offload.Manager(DEV, sync="blocking", device_target_bytes=target)
        func = torch_offload.PlannedCheckpoint(manager)
    else:
        manager = torch_offload.Manager(DEV, sync="blocking")
        func = torch_offload.CheckpointOffload(manager)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a target the plan cannot meet: not this case's concern
        got = train(func, steps=3, scope=manager if plan else None, by_keyword=True)
    assert_same(none, got)
    assert manager.stats().bytes_offloaded > 0, manager.stats()
    if plan:
        summary = func.summary()
        assert summary.count("\nblock ") == 6, summary
        # each layer's input (8 x 32 x 64 float32) was measured: not 0 bytes
        assert "input 0 B" not in summary and "input 65536 B" in summary, summary


@testdevice.sim_only("sets sim's link bandwidth so that recomputing beats offloading")
def test_planned_checkpoint_keeps_recomputed_inputs_over_a_slow_link():
    # 0.02 GB/s: offloading a layer's tensors or an input costs far more than
    # recomputing the layer; blocking copies are exposed whole, so the plan
    # keeps the inputs of the layers it recomputes where the target allows.
    import torch_offload.sim as sim

    plain_peak = train(None, steps=1)[2]
    none = train(None, steps=4)
    bandwidth = sim.config()["copy_bandwidth_gbps"]
    sim.set_copy_bandwidth_gbps(0.02)
    try:
        manager = torch_offload.Manager(DEV, sync="blocking", device_target_bytes=int(0.9 * plain_peak) + (1 << 20))
        planned = torch_offload.PlannedCheckpoint(manager)
        got = train(planned, steps=4, scope=manager)
    finally:
        sim.set_copy_bandwidth_gbps(bandwidth)
    assert_same(none, got)
    summary = planned.summary()
    assert manager.stats().blocks_recomputed > 0, summary
    assert ": recompute (input kept)" in summary, summary


def test_planned_module_list_and_enable_with_plan_auto():
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(4)).to(DEV)
    x = torch.randn(16, 32, device=DEV)
    expected = blocks[3](blocks[2](blocks[1](blocks[0](x)))).square().mean()
    (want,) = torch.autograd.grad(expected, [blocks[0][0].weight])
    manager = torch_offload.Manager(DEV, device_target_bytes=1 << 30)
    planned = torch_offload.PlannedModuleList(blocks, manager)
    for _ in range(3):
        with manager:
            loss = planned(x).square().mean()
        (got,) = torch.autograd.grad(loss, [blocks[0][0].weight])
        assert torch.equal(loss, expected) and torch.equal(got, want)
    assert manager.stats().blocks_kept == 4
    # outside `with manager:` the blocks just run: no turn of the plan is taken
    manager.reset_stats()
    assert torch.equal(planned(x).square().mean(), expected)
    assert manager.stats().blocks_kept == 4  # still the last step's choices
    with manager:
        pass  # a step without planned blocks changes nothing
    with manager:
        planned(x)
    assert manager.stats().blocks_kept == 4
    model = TinyLM().to(DEV)
    func = torch_offload.enable_gradient_checkpointing(model, manager, plan="auto")
    assert isinstance(func, torch_offload.PlannedCheckpoint)


def test_planned_module_list_is_a_module_list_whose_state_dict_is_the_models():
    # It nested the blocks under `.blocks`: not iterable, not indexable, and
    # `model.layers = PlannedModuleList(model.layers, m)` renamed every key
    # to `layers.blocks.N...`, so checkpoints saved without it did not load.
    torch.manual_seed(0)
    model = TinyLM(layers=3).to(DEV)
    saved = copy.deepcopy(model.state_dict())
    layers = list(model.layers)
    manager = torch_offload.Manager(DEV, device_target_bytes=1 << 30)
    model.layers = torch_offload.PlannedModuleList(model.layers, manager)
    assert isinstance(model.layers, nn.ModuleList)
    assert len(model.layers) == 3 and list(model.layers) == layers and model.layers[1] is layers[1]
    assert model.layers[-1] is layers[2] and model.layers.blocks is model.layers
    assert list(model.state_dict()) == list(saved)
    model.load_state_dict(saved)  # saved without it, loads with it
    plain = TinyLM(layers=3).to(DEV)
    plain.load_state_dict(model.state_dict())  # and back
    assert isinstance(model.layers[:2], nn.ModuleList) and not isinstance(model.layers[:2], type(model.layers))
    old = {k.replace("layers.", "layers.blocks.", 1) if k.startswith("layers.") else k: v for k, v in saved.items()}
    model.load_state_dict(old)  # as the nesting PlannedModuleList saved it
    model.layers.append(Layer(64).to(DEV))
    model.layers.extend([Layer(64).to(DEV)])
    model.layers.insert(0, Layer(64).to(DEV))
    assert len(model.layers) == 6 and "layers.5.up.weight" in model.state_dict()
    assert not [n for n, _ in model.named_modules() if "planned" in n]
    x = torch.randn(2, 8, 64, device=DEV)
    torch.manual_seed(3)  # the layers' dropout
    want = functools.reduce(lambda h, m: m(h), list(model.layers), x)
    torch.manual_seed(3)
    with manager:
        got = model.layers(x)
    assert torch.equal(got, want)


def test_a_dropped_planned_model_frees_its_device_memory_without_the_garbage_collector():
    # The blocks' hooks once held their list strongly (list -> block ->
    # hook -> list): a dropped model kept its parameters on the device until
    # the garbage collector ran, and the next measurement saw them.
    import gc

    testdevice.synchronize(0)
    before = testdevice.device_bytes(0)
    gc.disable()
    try:
        model = TinyLM(layers=2).to(DEV)
        manager = torch_offload.Manager(DEV, device_target_bytes=1 << 30)
        model.layers = torch_offload.PlannedModuleList(model.layers, manager)
        assert testdevice.device_bytes(0) > before
        del model, manager
        testdevice.synchronize(0)
        assert testdevice.device_bytes(0) == before
    finally:
        gc.enable()


def test_a_planned_module_list_iterated_by_the_models_forward_warns_once():
    # As a ModuleList, a forward that iterates it (for layer in self.layers)
    # runs the blocks without the plan: said once, where the list itself
    # called (and its recomputations in backward) say nothing.
    torch.manual_seed(0)
    model = TinyLM(layers=2).to(DEV)
    manager = torch_offload.Manager(DEV, device_target_bytes=1 << 30)
    model.layers = torch_offload.PlannedModuleList(model.layers, manager)
    ids = torch.randint(0, 64, (2, 16), device=DEV)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with manager:
                model.layers(model.embed(ids)).sum().backward()  # the list itself
        model.layers[0](model.embed(ids)).sum().backward()  # outside the scope: nothing to say
        for _ in range(2):
            with manager:
                h = model.embed(ids)
                for layer in model.layers:  # iterated
                    h = layer(h)
                h.sum().backward()
    ours = [str(w.message) for w in caught if issubclass(w.category, torch_offload.OffloadWarning)]
    assert len(ours) == 1 and "ran forward outside the list's own forward" in ours[0], ours
    assert "h = self.layers(h, ...)" in ours[0]


def test_planned_blocks_under_no_offload_inside_the_manager_are_no_step_of_the_plan():
    # A first pass under no_offload() inside `with manager:` (with grad on)
    # ran as a measuring step that saw no memory statistics: the plan then
    # recomputed every block for good, warning that the device reports none.
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(4)).to(DEV)
    x = torch.randn(16, 32, device=DEV)
    expected = blocks[3](blocks[2](blocks[1](blocks[0](x)))).square().mean()
    (want,) = torch.autograd.grad(expected, [blocks[0][0].weight])
    manager = torch_offload.Manager(DEV, device_target_bytes=1 << 30)
    planned = torch_offload.PlannedModuleList(blocks, manager)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with manager, torch_offload.no_offload():
            loss = planned(x).square().mean()
        (got,) = torch.autograd.grad(loss, [blocks[0][0].weight])
        assert torch.equal(loss, expected) and torch.equal(got, want)
        stats = manager.stats()
        assert stats.blocks_kept + stats.blocks_offloaded + stats.blocks_recomputed == 0, stats
        assert stats.tensors_seen == 0, stats
        for _ in range(3):
            with manager:
                loss = planned(x).square().mean()
            (got,) = torch.autograd.grad(loss, [blocks[0][0].weight])
            assert torch.equal(loss, expected) and torch.equal(got, want)
    assert manager.stats().blocks_kept == 4, planned.summary()
    assert not [w for w in caught if issubclass(w.category, torch_offload.OffloadWarning)], [
        str(w.message) for w in caught
    ]


@pytest.mark.parametrize("target", [1 << 30, 1])
def test_planned_blocks_with_batchnorm_leave_running_statistics_as_without_checkpointing(target):
    # The measuring step recomputes every block (and a target below what
    # that reaches recomputes them every step): a recomputed BatchNorm
    # would update its running statistics a second time, and evaluation
    # after training would differ from the run without checkpointing.
    def blocks():
        torch.manual_seed(0)
        return nn.ModuleList(
            nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.GELU(), nn.Linear(64, 32)) for _ in range(4)
        ).to(DEV)

    def run(planned_with=None):
        model = blocks()
        forward = model if planned_with is None else torch_offload.PlannedModuleList(model, planned_with)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        torch.manual_seed(1)
        x = torch.randn(16, 32, device=DEV)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            if planned_with is None:
                loss = nn.Sequential(*model)(x).square().mean()
            else:
                with planned_with:
                    loss = forward(x).square().mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            evaluated = nn.Sequential(*model)(x)
        return losses, evaluated, [b.clone() for b in model.buffers()]

    want = run()
    manager = torch_offload.Manager(DEV, device_target_bytes=target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_offload.OffloadWarning)  # target 1: "below what recomputing ... needs"
        got = run(manager)
    assert manager.stats().blocks_recomputed == (4 if target == 1 else 0), manager.stats()
    assert got[0] == want[0]
    assert torch.equal(got[1], want[1])
    assert all(torch.equal(a, b) for a, b in zip(got[2], want[2], strict=True))


class _Masked(nn.Module):
    """A block with BatchNorm and a constant buffer its forward only reads
    (as nanoGPT's causal mask): 1 MiB."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.norm = nn.BatchNorm1d(32)
        self.register_buffer("mask", torch.ones(512, 512))

    def forward(self, x):
        return self.norm(self.lin(x)) * self.mask[: x.shape[0], :32]


def test_a_recomputed_block_holds_no_copy_of_the_buffers_its_forward_leaves_as_they_were():
    # A recomputed block must rerun with the state its forward saw, so what
    # the forward writes (BatchNorm's running statistics) is copied when
    # it begins. A buffer it only reads needs no copy: held from forward to
    # backward, 4 blocks' masks took 4 MiB, and the plan peaked above the
    # run without the library.
    def run(planned):
        torch.manual_seed(0)
        blocks = nn.ModuleList(_Masked() for _ in range(4)).to(DEV)
        manager = torch_offload.Manager(DEV, device_target_bytes=1)
        forward = torch_offload.PlannedModuleList(blocks, manager) if planned else nn.Sequential(*blocks)
        torch.manual_seed(1)
        x = torch.randn(16, 32, device=DEV)
        losses, held = [], []
        for _ in range(3):
            testdevice.synchronize(0)
            before = testdevice.device_bytes(0)
            with manager if planned else contextlib.nullcontext():
                loss = forward(x).square().mean()
            testdevice.synchronize(0)
            held.append(testdevice.device_bytes(0) - before)
            loss.backward()
            losses.append(loss.item())
        if planned:
            assert manager.stats().blocks_recomputed == 4
        return losses, held, [b.clone() for b in blocks.buffers()]

    want = run(planned=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_offload.OffloadWarning)  # target 1: "below what recomputing ... needs"
        got = run(planned=True)
    assert got[0] == want[0]
    assert all(torch.equal(a, b) for a, b in zip(got[2], want[2], strict=True))  # running statistics as without
    assert all(h < 512 * 512 * 4 for h in got[1]), got[1]  # under one mask


@pytest.mark.parametrize("plan", [None, "auto"])
def test_a_model_with_offloaded_checkpointing_deep_copies_and_pickles(plan):
    # An EMA copy or a reference model (copy.deepcopy) shares the manager;
    # torch.save pickles it as its arguments (they raised "cannot pickle
    # PackHook" before).
    manager = torch_offload.Manager(DEV, sync="blocking", min_offload_bytes=7, device_target_bytes=1 << 30)
    torch.manual_seed(0)
    model = TinyLM().to(DEV).train()
    torch_offload.enable_gradient_checkpointing(model, manager, plan=plan)
    twin = copy.deepcopy(model)
    assert twin.layers[0]._gradient_checkpointing_func.manager is manager
    assert copy.copy(manager) is manager
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1)).to(DEV)
    losses = []
    for m in (model, twin):
        torch.manual_seed(2)  # dropout
        with manager:
            loss = m(ids, ids)
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == losses[1]
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), twin.parameters(), strict=True))

    on_cpu = TinyLM()
    torch_offload.enable_gradient_checkpointing(on_cpu, manager, plan=plan)
    buffer = io.BytesIO()
    torch.save(on_cpu, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False).layers[0]._gradient_checkpointing_func.manager
    assert loaded is not manager
    assert loaded.options == manager.options
    assert repr(loaded) == repr(manager)


def test_planned_bad_input():
    with pytest.raises(TypeError, match="manager must be a torch_offload.Manager, got str"):
        torch_offload.PlannedCheckpoint("sim")
    with pytest.raises(ValueError, match="device_target_bytes must be > 0"):
        torch_offload.PlannedCheckpoint(torch_offload.Manager(DEV))
    with pytest.raises(ValueError, match="use_reentrant must be False"):
        torch_offload.PlannedCheckpoint(torch_offload.Manager(DEV, device_target_bytes=1 << 20), use_reentrant=True)
    with pytest.raises(ValueError, match="plan must be None or 'auto', got 'sometimes'"):
        torch_offload.enable_gradient_checkpointing(TinyLM(), plan="sometimes")
    with pytest.raises(ValueError, match="PlannedCheckpoint: use_reentrant must be False, got 'yes'"):
        torch_offload.PlannedCheckpoint(torch_offload.Manager(DEV, device_target_bytes=1 << 20), use_reentrant="yes")
    with pytest.raises(TypeError, match="enable_gradient_checkpointing: model must be a torch.nn.Module, got str"):
        torch_offload.enable_gradient_checkpointing("model", plan="auto")
    for bad in (0, -3, "x", True):
        with pytest.raises(ValueError, match=f"every_n_layers must be an int >= 1, got {bad!r}"):
            torch_offload.enable_gradient_checkpointing(TinyLM(), every_n_layers=bad)
    untouched = TinyLM()
    with pytest.raises(TypeError, match="plan='auto' needs manager, a torch_offload.Manager .*got NoneType"):
        torch_offload.enable_gradient_checkpointing(untouched, plan="auto")
    assert not any(getattr(m, "gradient_checkpointing", False) for m in untouched.modules())
    manager = torch_offload.Manager(DEV, device_target_bytes=1 << 20)
    plain = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(ValueError, match="no module of the Sequential has a gradient_checkpointing attribute"):
        torch_offload.enable_gradient_checkpointing(plain, manager, plan="auto")
    with pytest.raises(TypeError, match="PlannedModuleList: blocks must be an nn.ModuleList .*got Linear"):
        torch_offload.PlannedModuleList(nn.Linear(4, 4), manager)
    assert len(torch_offload.PlannedModuleList(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), manager)) == 2
    with pytest.raises(TypeError, match="PlannedModuleList: blocks must be an nn.ModuleList .*got int"):
        torch_offload.PlannedModuleList(3, manager)
    with pytest.raises(TypeError, match=r"got ModuleDict \(pass its .values\(\), in the order they run\)"):
        torch_offload.PlannedModuleList(nn.ModuleDict({"a": nn.Linear(4, 4)}), manager)
    # A misspelt checkpoint keyword at construction (it would reach every
    # block's function, or be dropped by one taking **kwargs) raises before
    # the model is changed.
    for make in (
        lambda: torch_offload.PlannedModuleList([nn.Linear(4, 4)], manager, preserve_rng_stat=False),
        lambda: torch_offload.PlannedCheckpoint(manager, preserve_rng_stat=False),
        lambda: torch_offload.CheckpointOffload(manager, preserve_rng_stat=False),
    ):
        with pytest.raises(TypeError, match="'preserve_rng_stat' is not a keyword argument of torch.utils.checkpoint"):
            make()
    with pytest.raises(TypeError, match="PlannedModuleList: 'a', 'b' are not keyword arguments of torch.utils"):
        torch_offload.PlannedModuleList([nn.Linear(4, 4)], manager, b=1, a=2)
    for plan in (None, "auto"):
        untouched = TinyLM()
        with pytest.raises(TypeError, match="enable_gradient_checkpointing: 'foo' is not a keyword argument of "):
            torch_offload.enable_gradient_checkpointing(untouched, manager, plan=plan, foo=1)
        assert not any(getattr(m, "gradient_checkpointing", False) for m in untouched.modules())
    torch_offload.PlannedCheckpoint(manager, preserve_rng_state=False, determinism_check="none", debug=False)


def test_an_exception_in_a_planned_block_closes_every_region_in_order():
    # torch.utils.checkpoint leaves its hooks pushed while an exception from
    # the block propagates; the manager then closed under them and warned of
    # an out-of-order close the user never made.
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.fail = nn.Linear(32, 32), False

        def forward(self, x):
            if self.fail:
                raise ValueError("bad input")
            return torch.relu(self.lin(x))

    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(4)).to(DEV)
    x = torch.randn(16, 32, device=DEV)
    for target in (1, 1 << 30):  # every block recomputed; every block kept
        manager = torch_offload.Manager(DEV, device_target_bytes=target)
        planned = torch_offload.PlannedModuleList(blocks, manager)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the target's own warning
            for _ in range(3):
                with manager:
                    loss = planned(x).sum()
                loss.backward()
        blocks[1].fail = True
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match="bad input"):
                with manager:
                    planned(x)
        blocks[1].fail = False
        assert not [str(w.message) for w in caught if issubclass(w.category, torch_offload.OffloadWarning)]
        assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
        with manager:  # and the next step trains
            loss = planned(x).sum()
        loss.backward()


def test_a_kept_block_is_offloaded_by_the_guard_where_the_device_holds_more_than_planned():
    # A step that holds more on the device than the one the plan was made
    # from (here a buffer made between blocks, standing for copies still in
    # flight or another part of the model growing) offloads a kept block
    # instead of crossing the target; bitwise either way.
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(4)).to(DEV)
    x = torch.randn(64, 64, device=DEV)
    device = torch.get_device_module(DEV.split(":")[0])

    forward_peaks = []

    def step(planned, extra_bytes):
        h, held = x, None
        for i, block in enumerate(blocks):
            if i == 2 and extra_bytes:
                held = torch.ones(extra_bytes // 4, device=DEV)  # kept until backward
            h = planned(block, h) if planned is not None else block(h)
        loss = h.square().mean() + (held.sum() * 0 if held is not None else 0)
        forward_peaks.append(device.max_memory_allocated(0))
        return loss, torch.autograd.grad(loss, [blocks[0][0].weight])[0]

    device.synchronize()
    device.reset_peak_memory_stats(0)
    base = device.memory_allocated(0)
    want = step(None, 0)
    plain_peak = device.max_memory_allocated(0) - base
    # room for what `want` holds and a third to spare
    manager = torch_offload.Manager(DEV, sync="blocking", device_target_bytes=base + plain_peak + plain_peak // 3)
    planned = torch_offload.PlannedCheckpoint(manager)
    for _ in range(3):  # measure, then every block kept
        with manager:
            loss, grad = step(planned, 0)
        assert torch.equal(loss, want[0]) and torch.equal(grad, want[1])
        del loss, grad
    s = manager.stats()
    assert s.blocks_kept == 4 and s.blocks_guarded == 0, planned.summary()
    extra = plain_peak // 2
    device.synchronize()
    device.reset_peak_memory_stats(0)
    with manager:
        loss, grad = step(planned, extra)
    assert torch.equal(loss, want[0]) and torch.equal(grad, want[1])
    s = manager.stats()
    assert s.blocks_guarded >= 1 and s.blocks_offloaded == s.blocks_guarded, planned.summary()
    # The guard is forward's: forward stays under the target; backward, whose
    # slack the buffer took, within one activation's gradient of it (the
    # largest storage a block saves, 64 x 256 floats). Without the guard the
    # step would need the buffer less the slack over the target (~170 KiB).
    target = manager.options["device_target_bytes"]
    assert forward_peaks[-1] <= target
    assert device.max_memory_allocated(0) <= target + 64 * 256 * 4


def _steps_with_peaks(model, manager, planned, steps=5, seq=64, reset_each_step=True, backward_inside=False):
    """Losses and each step's device peak (absolute) of `steps` AdamW steps
    of `model` (a TinyLM) whose layers run through `planned` (a
    PlannedModuleList; None: plainly), each forward inside `with manager:`
    (with its backward too where `backward_inside`).
    `reset_each_step`: the device's peak statistics are reset before each
    step (else once, before the first, and the peaks are running ones)."""
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 64, (8, seq + 1), generator=g)
    ids, labels = data[:, :-1].to(DEV), data[:, 1:].to(DEV)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, peaks = [], []
    for step in range(steps):
        optimizer.zero_grad()
        testdevice.synchronize(0)
        if reset_each_step or step == 0:
            testdevice.reset_peak(0)
        h = model.embed(ids)
        with manager if manager is not None else contextlib.nullcontext():
            h = planned(h) if planned is not None else functools.reduce(lambda x, m: m(x), model.layers, h)
            logits = model.head(h)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
            if backward_inside:
                loss.backward()
        if not backward_inside:
            loss.backward()
        optimizer.step()
        testdevice.synchronize(0)
        peaks.append(testdevice.peak_bytes(0))
        losses.append(loss.item())
    return losses, peaks


@pytest.mark.parametrize("sync", ["streamed", "blocking"])
def test_a_plan_counts_every_kept_block_where_the_output_head_peaks(sync):
    # An output head over 4096 tokens peaks after the last block, where a
    # plan keeping every block holds all of them. The target sits half a
    # block's saved bytes under the peak without offloading: keeping every
    # block would cross it (the model once counted all but the last there).
    def fresh():
        testdevice.warm_up()
        torch.manual_seed(0)
        return TinyLM(vocab=4096, width=128, layers=4).to(DEV).train()

    none_losses, none_peaks = _steps_with_peaks(fresh(), None, None)
    probe = torch_offload.Manager(DEV, sync=sync, device_target_bytes=1 << 40)
    model = fresh()
    planned = torch_offload.PlannedModuleList(model.layers, probe)
    _steps_with_peaks(model, probe, planned, steps=1)
    saves = int(planned.summary().split("block 0: ")[1].split(" saves ")[1].split(" B")[0])
    del model, planned, probe
    target = none_peaks[-1] - saves // 2
    manager = torch_offload.Manager(DEV, sync=sync, device_target_bytes=target)
    model = fresh()
    planned = torch_offload.PlannedModuleList(model.layers, manager)
    losses, peaks = _steps_with_peaks(model, manager, planned)
    assert losses == none_losses
    summary = planned.summary()
    assert "after the last block the device peaked at" in summary, summary
    assert manager.stats().blocks_kept < 4, summary
    assert all(p <= target * 1.02 for p in peaks[1:]), (peaks, target, summary)


def _fresh_tiny_lm():
    testdevice.warm_up()
    torch.manual_seed(0)
    return TinyLM(width=128, layers=4).to(DEV).train()


def _between_offloading_and_recomputing_every_block(steps, backward_inside=False):
    """With blocking copies: the peaks of offloading every block (no target)
    and of recomputing every block (a target of 1 byte), checked to differ
    that way, and a target halfway between them."""
    everything = torch_offload.Manager(DEV, sync="blocking")
    _, offload_peaks = _steps_with_peaks(_fresh_tiny_lm(), everything, None, steps, backward_inside=backward_inside)
    low = torch_offload.Manager(DEV, sync="blocking", device_target_bytes=1)
    model = _fresh_tiny_lm()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_offload.OffloadWarning)  # target 1: "below what recomputing ... needs"
        planned = torch_offload.PlannedModuleList(model.layers, low)
        _, recompute_peaks = _steps_with_peaks(model, low, planned, steps, backward_inside=backward_inside)
    assert low.stats().blocks_recomputed == 4
    assert offload_peaks[-1] < recompute_peaks[-1], (offload_peaks, recompute_peaks)
    return (offload_peaks[-1] + recompute_peaks[-1]) // 2, recompute_peaks


def _planned_under(target, steps, **step_options):
    """`steps` steps of a fresh TinyLM whose layers run through a
    PlannedModuleList of a blocking manager with `target`: its manager, the
    losses and peaks, the plan's summary and the "below what ... needs"
    warnings given."""
    manager = torch_offload.Manager(DEV, sync="blocking", device_target_bytes=target)
    model = _fresh_tiny_lm()
    planned = torch_offload.PlannedModuleList(model.layers, manager)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses, peaks = _steps_with_peaks(model, manager, planned, steps=steps, **step_options)
    below = [str(w.message) for w in caught if "below what" in str(w.message)]
    return manager, losses, peaks, planned.summary(), below


@pytest.mark.parametrize("reset_each_step", [True, False])
def test_a_plan_tries_offloading_every_block_where_recomputing_every_block_does_not_fit(reset_each_step):
    # With blocking copies an offloaded block's tensors come back one
    # operation at a time in backward, while a recomputed block holds all
    # of its tensors at once: offloading every block peaks lower. A target
    # between the two used to be called unreachable, and every block was
    # recomputed, over the target, where the plan's step 2 now tries
    # offloading every block and keeps doing so. With the device's peak
    # statistics reset once, before training, later steps raise no peak:
    # what they need is the per-tensor plan's model, which must not undo
    # the choice (it once re-measured and recomputed every block).
    none_losses, _ = _steps_with_peaks(_fresh_tiny_lm(), None, None, steps=7)
    target, recompute_peaks = _between_offloading_and_recomputing_every_block(steps=5)
    manager, losses, peaks, summary, below = _planned_under(target, 7, reset_each_step=reset_each_step)
    assert losses == none_losses
    assert not below, summary
    assert "every block offloaded, tried, needed" in summary, summary
    assert manager.stats().blocks_offloaded == 4, summary
    assert manager.stats().bytes_offloaded > 0
    if reset_each_step:
        assert all(p <= target * 1.02 for p in peaks[1:]), (peaks, target, recompute_peaks, summary)


@pytest.mark.parametrize("backward_inside", [True, False])
def test_a_plan_meets_its_target_wherever_backward_runs(backward_inside):
    # `loss.backward()` inside `with manager:` (as README.md shows) once
    # ended the plan's forward at the scope's exit: the measuring step took
    # the whole step's peak for the forward's, predicted that recomputing
    # every block needed it, warned that the target could not be met and
    # recomputed every block, over a target that offloading every block
    # meets (as it does with backward after the scope). Blocking copies:
    # offloading every block peaks lower than recomputing every block
    # (test_a_plan_tries_offloading_every_block_...).
    none_losses, _ = _steps_with_peaks(_fresh_tiny_lm(), None, None, steps=6)
    target, recompute_peaks = _between_offloading_and_recomputing_every_block(3, backward_inside)
    manager, losses, peaks, summary, below = _planned_under(target, 6, backward_inside=backward_inside)
    assert losses == none_losses
    assert not below, summary
    assert manager.stats().blocks_recomputed < 4 and manager.stats().bytes_offloaded > 0, summary
    assert all(p <= target * 1.02 for p in peaks[2:]), (peaks, target, recompute_peaks, summary)


def test_one_step_holding_extra_device_memory_does_not_keep_the_plan_conservative():
    # A loop that holds a tensor over one step (a failed step's graph, an
    # evaluation batch): that step's first block finds it allocated and the
    # plan makes room. Once it is gone, the plan went on recomputing every
    # block for good, though keeping every block fit.
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(4)).to(DEV)
    plain = copy.deepcopy(blocks)
    x = torch.randn(4, 48, 64, generator=torch.Generator().manual_seed(1)).to(DEV)

    def run(layers, manager, forward):
        optimizer = torch.optim.AdamW(layers.parameters(), lr=1e-3)
        losses, kept = [], []
        for step in range(9):
            held = torch.empty(1 << 20, device=DEV) if step == 3 else None  # 4 MiB over step 3 only
            with manager if manager is not None else contextlib.nullcontext():
                loss = forward(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            del held
            losses.append(loss.item())
            kept.append(manager.stats().blocks_kept if manager is not None else None)
        return losses, kept

    want, _ = run(plain, None, nn.Sequential(*plain))
    testdevice.warm_up()
    testdevice.synchronize(0)
    # Room for every block kept, not with the held tensor as well.
    manager = torch_offload.Manager(DEV, device_target_bytes=testdevice.device_bytes(0) + (6 << 20))
    planned = torch_offload.PlannedModuleList(blocks, manager)
    got, kept = run(blocks, manager, planned)
    assert got == want
    assert kept[2] == 4 and kept[3] < 4, (kept, planned.summary())  # step 3 made room
    assert kept[5:] == [4] * 4, (kept, planned.summary())  # given back two steps after


def test_planned_blocks_whose_inputs_the_manager_never_sees_warn_and_recompute():
    # Inputs under min_offload_bytes stay on the device unseen: the measuring
    # step measures no peak, so the plan says so and recomputes every block.
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(4)).to(DEV)
    x = torch.randn(4, 32, device=DEV)
    expected = functools.reduce(lambda h, m: m(h), blocks, x).square().mean()
    (want,) = torch.autograd.grad(expected, [blocks[0][0].weight])
    manager = torch_offload.Manager(DEV, device_target_bytes=1 << 30, min_offload_bytes=1 << 20)
    planned = torch_offload.PlannedModuleList(blocks, manager)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with manager:
                loss = planned(x).square().mean()
            (got,) = torch.autograd.grad(loss, [blocks[0][0].weight])
            assert torch.equal(loss, expected) and torch.equal(got, want)
    messages = [str(w.message) for w in caught if "measured no peak" in str(w.message)]
    assert len(messages) == 1 and "min_offload_bytes" in messages[0], [str(w.message) for w in caught]
    assert manager.stats().blocks_recomputed == 4


class _Flagged(nn.Module):
    """A block taking keyword arguments named like torch.utils.checkpoint's options."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x, debug=False, determinism_check="none"):
        return self.lin(x) * (2.0 if debug else 1.0) + (1.0 if determinism_check == "block's" else 0.0)


def test_planned_module_list_passes_keyword_arguments_to_the_blocks_whatever_the_plan_chooses():
    torch.manual_seed(0)
    blocks = nn.ModuleList(_Flagged() for _ in range(3)).to(DEV)
    x = torch.randn(8, 32, device=DEV)
    expected = functools.reduce(lambda h, m: m(h, debug=True, determinism_check="block's"), blocks, x).sum()
    for target in (1 << 12, 1 << 30):  # every block recomputed; every block kept
        manager = torch_offload.Manager(DEV, device_target_bytes=target)
        planned = torch_offload.PlannedModuleList(blocks, manager)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the low target's warning
            for _ in range(3):
                with manager:
                    loss = planned(x, debug=True, determinism_check="block's").sum()
                loss.backward()
                assert torch.equal(loss, expected)


def test_planned_blocks_under_autocast_are_bitwise_whatever_the_plan_chooses():
    # Mixed precision: the blocks' matmuls run in bfloat16 under autocast,
    # and a recomputed block runs again under the autocast state of its
    # forward (torch.utils.checkpoint restores it), dropout's RNG included.
    torch.manual_seed(0)
    blocks = nn.ModuleList(
        nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 32)) for _ in range(4)
    ).to(DEV)
    x = torch.randn(16, 32, device=DEV, requires_grad=True)
    kind = torch.device(DEV).type

    def run(planned=None, manager=None):
        torch.manual_seed(1)
        with torch.autocast(kind, dtype=torch.bfloat16):
            with manager if manager is not None else contextlib.nullcontext():
                out = planned(x) if planned is not None else functools.reduce(lambda h, m: m(h), blocks, x)
            loss = out.float().square().mean()
        return out, torch.autograd.grad(loss, [x, *blocks.parameters()])

    want_out, want_grads = run()
    assert want_out.dtype == torch.bfloat16
    for target, choice in ((1 << 30, "blocks_kept"), (1 << 12, "blocks_recomputed")):
        manager = torch_offload.Manager(DEV, device_target_bytes=target)
        planned = torch_offload.PlannedModuleList(blocks, manager)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the low target's warning
            for _ in range(3):
                out, grads = run(planned, manager)
                assert torch.equal(out, want_out)
                assert all(torch.equal(a, b) for a, b in zip(grads, want_grads, strict=True))
        assert getattr(manager.stats(), choice) == 4, planned.summary()


class _HFLayer(nn.Module):
    """A layer checkpointed as transformers 5.x does it: the class's
    forward, unbound, with the layer as its first argument
    (``partial(forward, self, **kwargs)``); BatchNorm inside."""

    def __init__(self):
        super().__init__()
        self.gradient_checkpointing = False
        self.lin = nn.Linear(32, 32)
        self.norm = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.1)

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training:
            return self._gradient_checkpointing_func(functools.partial(type(self).forward, self, **kwargs), *args)
        return super().__call__(*args, **kwargs)

    def forward(self, hidden_states, scale=1.0):
        return hidden_states + self.drop(self.norm(self.lin(hidden_states))) * scale


@pytest.mark.parametrize("by_keyword", [False, True])
@pytest.mark.parametrize("target", [1 << 30, 1])
def test_a_transformers_5_layer_with_batchnorm_is_restored_whatever_the_plan(target, by_keyword):
    # transformers 5.x hands the checkpoint function partial(forward, self,
    # ...): the layer is the partial's first argument, not a bound method's
    # owner. A recomputed layer must still run with the running statistics
    # its forward saw, and leave them as it found them.
    def run(func=None, manager=None):
        torch.manual_seed(0)
        layers = nn.ModuleList(_HFLayer() for _ in range(4)).to(DEV).train()
        for layer in layers:
            layer._gradient_checkpointing_func = func
            layer.gradient_checkpointing = func is not None
        optimizer = torch.optim.AdamW(layers.parameters(), lr=1e-2)
        torch.manual_seed(1)
        x = torch.randn(16, 32, device=DEV)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            with manager if manager is not None else contextlib.nullcontext():
                h = x
                for layer in layers:
                    h = layer(hidden_states=h, scale=0.5) if by_keyword else layer(h, scale=0.5)
                loss = h.square().mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        layers.eval()
        with torch.no_grad():
            h = x
            for layer in layers:
                h = layer(h, scale=0.5)
        return losses, h, [b.clone() for b in layers.buffers()]

    want = run()
    manager = torch_offload.Manager(DEV, device_target_bytes=target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_offload.OffloadWarning)  # target 1: "below what recomputing ... needs"
        got = run(torch_offload.PlannedCheckpoint(manager), manager)
    assert manager.stats().blocks_recomputed == (4 if target == 1 else 0), manager.stats()
    assert got[0] == want[0]
    assert torch.equal(got[1], want[1])
    assert all(torch.equal(a, b) for a, b in zip(got[2], want[2], strict=True))


# The input given at the call stays a keyword, so only checkpoint's own
# host tensor reaches the manager: its "none was on a sim device" warning.
@pytest.mark.filterwarnings("ignore:offload..Scope. 1 tensors were saved:torch_offload.OffloadWarning")
def test_checkpoint_keywords_given_at_the_call_override_the_callables_own():
    # A keyword given at the call wins over the partial's of the same name
    # (as for a plain partial and torch's checkpoint); use_reentrant=False
    # may be repeated there, use_reentrant=True raises before anything runs.
    manager = torch_offload.Manager(DEV, sync="blocking")
    func = torch_offload.CheckpointOffload(manager)
    x = torch.randn(8, 8, device=DEV, requires_grad=True)
    y = torch.randn(8, 8, device=DEV, requires_grad=True)

    def f(hidden_states):
        return (hidden_states * 3).sin()

    out = func(functools.partial(f, hidden_states=x), hidden_states=y, use_reentrant=False)
    assert torch.equal(out, f(y))
    out.sum().backward()
    assert x.grad is None and torch.equal(y.grad, (3 * (y * 3).cos()))
    planned = torch_offload.PlannedCheckpoint(torch_offload.Manager(DEV, device_target_bytes=1 << 30))
    for callable_ in (func, planned):
        with pytest.raises(ValueError, match="use_reentrant must be False, got True"):
            callable_(f, x, use_reentrant=True)
    # A planned block that just runs (outside the manager, or kept) gets
    # none of checkpoint's own keywords.
    assert torch.equal(planned(f, x, use_reentrant=False, determinism_check="none"), f(x))
    with planned.manager:
        assert torch.equal(planned(f, x, determinism_check="none", debug=False), f(x))
