# SPDX-License-Identifier: MIT
"""The drop-ins torch_offload.trl (TRL 1.16.0) and torchtune (torchtune
0.6.1) and the top-level names, without the peers installed: signatures and
positional orders, update_model_params, and the head search on every shape
the peers recognise (and the near-misses they do not). The peers' own code
runs in tests/thirdparty/."""

import contextlib
import importlib
import inspect
import sys
import warnings

import pytest
import torch
from torch import nn

import torch_offload
import torch_offload.sim
import torch_offload.torchtune
import torch_offload.trl
from test_torch_offload import assert_bitwise, leaf
from testdevice import DEV

# ---------------------------------------------------------------- signatures

TRL_OFFLOAD = [("use_pin_memory", True), ("use_streams", True), ("min_offload_size", 1024), ("max_fwd_stash_size", 5)]
TRL_GET = [
    ("model", inspect.Parameter.empty),
    ("use_pin_memory", True),
    ("use_streams", True),
    ("min_offload_size", 1024),
    ("max_fwd_stash_size", 5),
    ("warn_if_no_head", True),
]
TUNE_OFFLOAD = [("use_pin_memory", True), ("use_streams", True), ("max_fwd_stash_size", 5), ("min_offload_size", 1024)]
TUNE_GET = [("model", inspect.Parameter.empty), ("enable_activation_offloading", inspect.Parameter.empty)]


def positional(fn):
    return [
        (p.name, p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]


@pytest.mark.parametrize(
    "fn,expected",
    [
        (torch_offload.trl.OffloadActivations, TRL_OFFLOAD),
        (torch_offload.trl.get_act_offloading_ctx_manager, TRL_GET),
        (torch_offload.torchtune.OffloadActivations, TUNE_OFFLOAD),
        (torch_offload.torchtune.get_act_offloading_ctx_manager, TUNE_GET),
    ],
    ids=["trl.OffloadActivations", "trl.get", "torchtune.OffloadActivations", "torchtune.get"],
)
def test_each_drop_in_has_its_peers_signature(fn, expected):
    assert positional(fn) == expected


def test_positional_orders_mean_what_each_peer_means():
    trl = torch_offload.trl.OffloadActivations(True, True, 2048, 3).options
    tune = torch_offload.torchtune.OffloadActivations(True, True, 3, 2048).options
    assert (
        (trl["min_offload_bytes"], trl["max_fwd_stash"])
        == (2048, 3)
        == (tune["min_offload_bytes"], tune["max_fwd_stash"])
    )
    top = torch_offload.OffloadActivations(False, False, min_offload_size=2048, max_fwd_stash_size=3)
    assert f"Manager<{DEV}, pageable_host, blocking>" in repr(top)
    assert (top.options["min_offload_bytes"], top.options["max_fwd_stash"]) == (2048, 3)
    assert torch_offload.trl.NoOpManager is torch_offload.torchtune.NoOpManager is torch_offload.NoOpManager
    model = nn.Linear(2, 2)
    assert isinstance(torch_offload.torchtune.get_act_offloading_ctx_manager(model, False), contextlib.nullcontext)
    # The top-level name takes torchtune's switch second, as torchtune's recipes pass it.
    assert isinstance(torch_offload.get_act_offloading_ctx_manager(model, False), contextlib.nullcontext)
    assert positional(torch_offload.get_act_offloading_ctx_manager) == [
        ("model", inspect.Parameter.empty),
        ("enable_activation_offloading", True),
    ]
    assert isinstance(
        torch_offload.trl.get_act_offloading_ctx_manager(model, False, warn_if_no_head=False),
        torch_offload.trl.OffloadActivations,
    )  # TRL: the second argument is use_pin_memory
    assert "pageable_host" in repr(
        torch_offload.trl.get_act_offloading_ctx_manager(model, False, warn_if_no_head=False)
    )


@pytest.mark.parametrize("make", [torch_offload.trl.OffloadActivations, torch_offload.OffloadActivations])
def test_update_model_params_keeps_frozen_weights_on_the_device(make):
    def run(manager, frozen):
        x = leaf(16, 64)
        with manager:
            loss = frozen(x).sum()
        loss.backward()
        return manager.stats(), x.grad

    frozen = nn.Linear(64, 64).to(DEV).requires_grad_(False)  # a 16 KiB weight saved for x's gradient
    plain, ref = run(make(), frozen)
    # A frozen weight is a parameter (a floating-point leaf): it stays even
    # untold, counted before exclusion is looked at.
    assert plain.tensors_offloaded == 0 and plain.passed_leaf == 1
    manager = make()
    manager.update_model_params(frozen)
    told, got = run(manager, frozen)
    assert told.tensors_offloaded == 0 and told.passed_leaf == 1
    assert_bitwise([ref], [got])


# ---------------------------------------------------------------- head search


class Tied:
    """torchtune's TiedLinear: not an nn.Module; its ``linear`` is one."""

    def __init__(self):
        self.linear = nn.Linear(8, 8)


def holder(**children):
    module = nn.Module()
    for name, child in children.items():
        setattr(module, name, child)
    return module


def shape(kind):
    """-> (model, the module expected to be kept, or None)."""
    head = nn.Linear(8, 8)
    if kind == "output":
        return holder(output=head, lm_head=nn.Linear(8, 8)), head
    if kind == "output.linear":
        tied = Tied()
        return holder(output=tied), tied.linear
    if kind == "output neither module nor linear":  # TRL stops there: lm_head is not looked at
        return holder(output=lambda x: x, lm_head=head), None
    if kind == "lm_head":
        return holder(lm_head=head, ln_f=nn.LayerNorm(8)), head
    if kind == "decoder.output":
        return holder(decoder=holder(output=head, lm_head=nn.Linear(8, 8))), head
    if kind == "decoder.lm_head":
        return holder(decoder=holder(lm_head=head)), head
    if kind == "decoder without a head":  # TRL stops there: ln_f is not looked at
        return holder(decoder=holder(body=nn.Linear(8, 8)), ln_f=nn.LayerNorm(8)), None
    if kind == "final_layer_norm":
        norm = nn.LayerNorm(8)
        return holder(final_layer_norm=norm, ln_f=nn.LayerNorm(8), head=head), norm
    if kind == "ln_f":
        norm = nn.LayerNorm(8)
        return holder(ln_f=norm, head=head), norm
    if kind == "head":
        return holder(head=head), head
    if kind == "head not a module":
        return holder(head=lambda x: x), None
    if kind == "final_layer":  # not a name TRL looks for
        return holder(final_layer=head), None
    if kind == ".module":
        return holder(module=holder(lm_head=head)), head
    if kind == "peft":
        return holder(base_model=holder(lm_head=head), peft_config={"default": None}), head
    if kind == "base_model without peft_config":
        return holder(base_model=holder(lm_head=head)), None
    if kind == ".module then peft":
        return holder(module=holder(base_model=holder(lm_head=head), peft_config={})), head
    raise AssertionError(kind)


TRL_SHAPES = [
    "output",
    "output.linear",
    "output neither module nor linear",
    "lm_head",
    "decoder.output",
    "decoder.lm_head",
    "decoder without a head",
    "final_layer_norm",
    "ln_f",
    "head",
    "head not a module",
    "final_layer",
    ".module",
    "peft",
    "base_model without peft_config",
    ".module then peft",
]


def hooked(model, extra=()):
    """The modules of ``model`` (and ``extra``) that got a forward pre-hook."""
    return [m for m in list(model.modules()) + list(extra) if m._forward_pre_hooks]


def call(get, model, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = get(model, *args)
    return manager, [str(w.message) for w in caught]


@pytest.mark.parametrize("kind", TRL_SHAPES)
@pytest.mark.parametrize(
    "get",
    [torch_offload.trl.get_act_offloading_ctx_manager, torch_offload.get_act_offloading_ctx_manager],
    ids=["trl", "top-level"],
)
def test_trl_head_search(get, kind):
    model, expected = shape(kind)
    extra = [model.output.linear] if kind == "output.linear" else []
    _, warned = call(get, model)
    assert hooked(model, extra) == ([expected] if expected is not None else [])
    assert len(warned) == (expected is None)
    if expected is None:
        assert "no output head detected (looked for output or output.linear, else lm_head" in warned[0]


def test_trl_keeps_liger_modules_and_the_head():
    liger, inner = nn.Linear(8, 8), nn.Linear(8, 8)
    model = holder(lm_head=nn.Linear(8, 8), layers=nn.ModuleList([holder(LigerRMSNorm=liger), nn.Linear(8, 8)]))
    liger.add_module("inside", inner)  # "layers.0.LigerRMSNorm.inside" names liger too
    torch_offload.trl.get_act_offloading_ctx_manager(model)
    assert {id(m) for m in hooked(model)} == {id(liger), id(inner), id(model.lm_head)}


@pytest.mark.parametrize(
    "kind,expected",
    [
        ("output", "output"),
        ("output.linear", "output.linear"),
        ("lm_head", None),
        ("decoder.output", "decoder.output"),
        ("none", None),
    ],
)
def test_torchtune_head_search(kind, expected):
    head = nn.Linear(8, 8)
    tied = Tied()
    model = {
        "output": holder(output=head),
        "output.linear": holder(output=tied),
        "lm_head": holder(lm_head=head),
        "decoder.output": holder(decoder=holder(output=head)),
        "none": holder(body=head),
    }[kind]
    _, warned = call(torch_offload.torchtune.get_act_offloading_ctx_manager, model, True)
    want = {"output": [head], "output.linear": [tied.linear], "decoder.output": [head], None: []}[expected]
    assert hooked(model, [tied.linear]) == want
    assert len(warned) == (expected is None)


class HeadedNet(nn.Module):
    """body -> relu -> head; the head's saved input is one more saved tensor."""

    def __init__(self, head_attr):
        super().__init__()
        self.body = nn.Linear(64, 64)
        self.head_attr = head_attr
        if head_attr == "output.linear":
            self.output = Tied()
            self.output.linear = nn.Linear(64, 64)
        else:
            setattr(self, head_attr, nn.Linear(64, 64))

    def forward(self, x):
        h = self.body(x).relu() * 2.0
        if self.head_attr == "output.linear":
            return self.output.linear(h)
        return getattr(self, self.head_attr)(h)


@pytest.mark.parametrize(
    "get,head_attr",
    [
        (torch_offload.trl.get_act_offloading_ctx_manager, "lm_head"),
        (torch_offload.trl.get_act_offloading_ctx_manager, "ln_f"),
        (lambda m: torch_offload.torchtune.get_act_offloading_ctx_manager(m, True), "output"),
        (lambda m: torch_offload.torchtune.get_act_offloading_ctx_manager(m, True), "output.linear"),
    ],
    ids=["trl lm_head", "trl ln_f", "torchtune output", "torchtune TiedLinear"],
)
def test_kept_head_trains_bitwise_and_saves_on_the_device(get, head_attr):
    def run(ctx_of):
        torch.manual_seed(0)
        model = HeadedNet(head_attr).to(DEV)
        if head_attr == "output.linear":
            model.output.linear.to(DEV)
        ctx = ctx_of(model)
        x = torch.randn(32, 64).to(DEV)
        with ctx:
            loss = model(x).square().sum()
        loss.backward()
        head = model.output.linear if head_attr == "output.linear" else getattr(model, head_attr)
        return [loss.detach(), head.weight.grad, model.body.weight.grad], ctx

    ref, _ = run(lambda m: contextlib.nullcontext())
    got, manager = run(get)
    assert_bitwise(ref, got)
    plain_manager = torch_offload.trl.OffloadActivations()
    run(lambda m: plain_manager)
    # relu's output and the product are offloaded either way; the head's
    # saved input only without the head kept on the device.
    assert manager.stats().tensors_offloaded >= 1
    assert manager.stats().tensors_seen < plain_manager.stats().tensors_seen


def _write_package(root, module, text):
    """Writes module `module` (dotted) under `root`, with its packages."""
    path = root.joinpath(*module.split("."))
    for depth in range(1, len(module.split("."))):
        package = root.joinpath(*module.split(".")[:depth])
        package.mkdir(exist_ok=True)
        (package / "__init__.py").touch()
    path.with_suffix(".py").write_text(text)


@pytest.mark.parametrize(
    "peer, home, user",
    [
        (torch_offload.trl, "trl.models.activation_offloading", "trl.trainer.sft_trainer"),
        (torch_offload.torchtune, "torchtune.training._activation_offloading", "recipes.full_finetune"),
    ],
    ids=["trl", "torchtune"],
)
def test_install_points_the_peers_own_code_at_ours(tmp_path, monkeypatch, peer, home, user):
    # `import torch_offload.trl` alone leaves TRL's trainers on TRL's own
    # offloading (SFTTrainer imported the function by name); install() is
    # the one line that switches them, including modules imported after it.
    # A stand-in peer on sys.path: `home` defines the three names, `user`
    # (a trainer, a recipe) imported one of them.
    package = home.split(".")[0]
    monkeypatch.setitem(sys.modules, package, None)  # not importable
    with pytest.raises(ImportError, match=rf"{peer.__name__}.install: {package} is not importable"):
        peer.install()
    monkeypatch.delitem(sys.modules, package)
    names = (
        "class OffloadActivations: pass\nclass NoOpManager: pass\ndef get_act_offloading_ctx_manager(*a): return 0\n"
    )
    _write_package(tmp_path, home, names)
    _write_package(tmp_path, user, f"from {home} import get_act_offloading_ctx_manager\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for top in {package, user.split(".")[0]}:
        for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            monkeypatch.delitem(sys.modules, name)
    before = importlib.import_module(user)
    theirs = before.get_act_offloading_ctx_manager
    try:
        peer.install()
        peer.install()  # idempotent
        assert before.get_act_offloading_ctx_manager is peer.get_act_offloading_ctx_manager
        assert importlib.import_module(home).OffloadActivations is peer.OffloadActivations
        assert importlib.import_module(home).NoOpManager is peer.NoOpManager
        _write_package(tmp_path, f"{package}.later", f"from {home} import OffloadActivations\n")
        assert importlib.import_module(f"{package}.later").OffloadActivations is peer.OffloadActivations
    finally:
        peer.uninstall()
    assert before.get_act_offloading_ctx_manager is theirs
    assert importlib.import_module(home).get_act_offloading_ctx_manager is theirs
    for top in {package, user.split(".")[0]}:
        for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            del sys.modules[name]
