# SPDX-License-Identifier: MIT
"""What the drop-ins for TRL (``torch_offload.trl``) and torchtune
(``torch_offload.torchtune``) share, and the top-level names
``torch_offload.OffloadActivations`` / ``NoOpManager`` /
``get_act_offloading_ctx_manager``, which follow TRL with every argument
where the two peers disagree taken by name only."""

import contextlib
import importlib
import sys
import warnings

from torch import nn

from ._manager import Manager, OffloadWarning, no_offload


class PeerOffload(Manager):
    """An ``OffloadActivations`` served by a Manager (every argument by name).

    Args (the peers' names and meaning):
        use_pin_memory: host copies in page-locked memory (storage
            ``"pinned_host"`` with ``pin_memory``), else ``"pageable_host"``.
        use_streams: a side copy stream with forward stash and backward
            prefetch (sync ``"streamed"``); ``False`` copies on the compute
            stream (``"blocking"``); ``None`` is True.
        min_offload_size: tensors whose storage is smaller than this many
            bytes stay on the device.
        max_fwd_stash_size: how many tensors may be in flight to the host
            in forward; at least 1 (ValueError otherwise).

    The device is the detected accelerator (``device="auto"``). Raises like
    Manager. Use as ``with OffloadActivations(): loss = model(x)``.
    """

    def __init__(self, *, use_pin_memory, use_streams, min_offload_size, max_fwd_stash_size):
        streams = True if use_streams is None else bool(use_streams)
        super().__init__(
            "auto",
            "pinned_host" if use_pin_memory else "pageable_host",
            "streamed" if streams else "blocking",
            min_offload_bytes=min_offload_size,
            max_fwd_stash=max_fwd_stash_size,
            pin_memory=bool(use_pin_memory),
        )


class ModelParams:
    """TRL's ``OffloadActivations.update_model_params``, as a mixin of a
    Manager; ``public_name`` is the class's name in its error messages."""

    public_name = "OffloadActivations"

    def update_model_params(self, model):
        """Never offload ``model``'s parameters and buffers (by storage, so
        views and frozen weights count too); TRL's public method, called by
        its ``get_act_offloading_ctx_manager``. Unlike TRL's, which replaces
        its set of parameter storages, a call adds to what was excluded
        before (an excluded storage is forgotten when it is freed).
        TypeError when ``model`` is not an ``nn.Module``."""
        check_module(f"{self.public_name}.update_model_params", model)
        self.exclude(model.parameters())
        self.exclude(model.buffers())


class NoOpManager(no_offload):
    """TRL's and torchtune's ``NoOpManager`` (the two are the same): inside
    it, saved tensors stay where they are even within an OffloadActivations
    region. ``__enter__`` returns None, so it can be entered from a forward
    pre-hook as both peers do."""


def check_module(where, model):
    """TypeError naming the type when ``model`` is not an ``nn.Module``."""
    if not isinstance(model, nn.Module):
        kind = type(model)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        raise TypeError(f"{where}: model must be a torch.nn.Module, got {name}")


def keep_on_device(modules):
    """Registers on each module of ``modules`` a forward pre-hook that opens
    one shared NoOpManager and a forward hook (``always_call``) that closes
    it, as TRL and torchtune do: those modules' activations are not
    offloaded. The hooks return None: inputs and outputs stay as they are."""
    noop = NoOpManager()
    for module in modules:
        module.register_forward_pre_hook(lambda *args: noop.__enter__())
        module.register_forward_hook(lambda *args: noop.__exit__(), always_call=True)


def _output(model):
    """``model.output`` when it is an ``nn.Module``, else its ``.linear``
    (torchtune's ``TiedLinear`` is not a module; its ``linear`` is)."""
    head = model.output
    return head if isinstance(head, nn.Module) else getattr(head, "linear", None)


def _first_set(model, *names):
    """The first of ``model``'s attributes ``names`` that is not None."""
    for name in names:
        value = getattr(model, name, None)
        if value is not None:
            return value
    return None


# Where each peer looks for the output head: (attributes, the head given
# the model); the first branch whose attributes the model has decides.
TORCHTUNE_HEAD_SEARCH = (
    (("output",), _output),
    (("decoder",), lambda m: getattr(m.decoder, "output", None)),
)
TRL_HEAD_SEARCH = (
    (("output",), _output),
    (("lm_head",), lambda m: m.lm_head),
    (
        ("decoder",),
        lambda m: (
            getattr(m.decoder, "output", None) if hasattr(m.decoder, "output") else getattr(m.decoder, "lm_head", None)
        ),
    ),
    (("final_layer_norm", "ln_f"), lambda m: _first_set(m, "final_layer_norm", "ln_f")),
    (("head",), lambda m: m.head),
)
TORCHTUNE_HEADS = "output or output.linear (a TiedLinear's), else decoder.output, each an nn.Module"
TRL_HEADS = (
    "output or output.linear, else lm_head, else decoder.output or decoder.lm_head, else final_layer_norm "
    "or ln_f, else head, each an nn.Module, after unwrapping .module and PEFT's .base_model"
)


def find_head(model, search):
    """The output head of ``model`` by ``search`` (``TORCHTUNE_HEAD_SEARCH``
    or ``TRL_HEAD_SEARCH``): the first branch whose attributes the model has
    decides, and a branch that finds no ``nn.Module`` ends the search with
    None (TRL raises AttributeError registering a hook on such a head)."""
    for names, head_of in search:
        if any(hasattr(model, name) for name in names):
            head = head_of(model)
            return head if isinstance(head, nn.Module) else None
    return None


def trl_keep_on_device(model):
    """The modules TRL 1.16's ``get_act_offloading_ctx_manager`` keeps on
    the device, found as it finds them: ``(head or None, liger_modules)``.

    ``model`` is unwrapped from ``.module`` (DDP, DeepSpeed) and then from
    PEFT's ``.base_model`` (when it has ``peft_config``); the head is
    ``find_head(unwrapped, TRL_HEAD_SEARCH)``. Every module whose qualified
    name contains ``liger`` (any case) is kept too."""
    unwrapped = model.module if hasattr(model, "module") else model
    if hasattr(unwrapped, "base_model") and hasattr(unwrapped, "peft_config"):
        unwrapped = unwrapped.base_model
    head = find_head(unwrapped, TRL_HEAD_SEARCH)
    liger = (
        [module for name, module in unwrapped.named_modules() if "liger" in name.lower()]
        if isinstance(unwrapped, nn.Module)
        else []
    )
    return head, liger


def warn_no_head(where, looked_for, silence, stacklevel):
    """The peers' "no output head was detected" warning, naming the search
    (an OffloadWarning, a UserWarning, through ``warnings``, where the peers log it)."""
    warnings.warn(
        f"{where}: no output head detected (looked for {looked_for}); its activations are offloaded "
        f"too, which usually slows training given the large vocabulary size{silence}",
        OffloadWarning,
        stacklevel=stacklevel + 1,
    )


def trl_ctx_manager(
    where, model, *, use_pin_memory, use_streams, min_offload_size, max_fwd_stash_size, warn_if_no_head, make
):
    """TRL's ``get_act_offloading_ctx_manager`` body: ``make(**options)``,
    the model's parameters and buffers excluded, TRL's head and Liger
    modules kept on the device, a warning naming the search when no head."""
    check_module(where, model)
    manager = make(
        use_pin_memory=use_pin_memory,
        use_streams=use_streams,
        min_offload_size=min_offload_size,
        max_fwd_stash_size=max_fwd_stash_size,
    )
    manager.update_model_params(model)
    head, liger = trl_keep_on_device(model)
    keep_on_device(([head] if head is not None else []) + liger)
    if head is None and warn_if_no_head:
        warn_no_head(where, TRL_HEADS, "; pass warn_if_no_head=False to silence this", stacklevel=3)
    return manager


class OffloadActivations(ModelParams, PeerOffload):
    """``OffloadActivations`` as TRL 1.16 has it (``torch_offload.trl``),
    with the arguments where TRL and torchtune disagree by name only.

    ``use_pin_memory`` and ``use_streams`` are the first two positional
    arguments of both peers; ``min_offload_size`` and ``max_fwd_stash_size``
    come third and fourth in TRL but fourth and third in torchtune, so here
    they are keyword-only (a third positional argument is a TypeError that
    says so). For a peer's exact signature import ``torch_offload.trl`` or
    ``torch_offload.torchtune``. Arguments as ``PeerOffload``;
    ``use_streams=None`` is True. Has TRL's ``update_model_params(model)``.
    """

    public_name = "torch_offload.OffloadActivations"

    def __init__(self, use_pin_memory=True, use_streams=True, *positional, min_offload_size=1024, max_fwd_stash_size=5):
        if positional:
            raise TypeError(
                "torch_offload.OffloadActivations: pass min_offload_size and max_fwd_stash_size by name "
                "(TRL takes them third and fourth, torchtune fourth and third); torch_offload.trl and "
                "torch_offload.torchtune take each peer's positional order"
            )
        super().__init__(
            use_pin_memory=use_pin_memory,
            use_streams=use_streams,
            min_offload_size=min_offload_size,
            max_fwd_stash_size=max_fwd_stash_size,
        )


def get_act_offloading_ctx_manager(
    model,
    enable_activation_offloading=True,
    *,
    use_pin_memory=True,
    use_streams=True,
    min_offload_size=1024,
    max_fwd_stash_size=5,
    warn_if_no_head=True,
):
    """TRL 1.16's ``get_act_offloading_ctx_manager`` (as
    ``torch_offload.trl``) with torchtune's switch as its second positional
    argument, every other argument by name.

    The second positional argument is ``use_pin_memory`` in TRL and
    ``enable_activation_offloading`` in torchtune (both bools that mean
    different things). Here it is torchtune's, as torchtune's recipes pass
    it (``get_act_offloading_ctx_manager(model, enable)``) and as this name
    always took it; TRL calls it with ``model`` alone (or by keyword), and
    TRL's other arguments are keyword-only here, so no call means something
    else than in the peer it was written for, except a positional
    ``use_pin_memory``, which ``torch_offload.trl`` takes.
    ``torch_offload.trl`` and ``torch_offload.torchtune`` take each peer's
    positional order.

    Returns an ``OffloadActivations`` with the model's parameters and
    buffers excluded, whose output head (found as TRL finds it:
    ``trl_keep_on_device``, which also covers torchtune's ``TiedLinear``)
    and Liger modules run without offloading; the head's activations are
    needed first in backward, so offloading them only costs time. With
    ``enable_activation_offloading=False``: ``contextlib.nullcontext()``.
    No head found: a warning naming what was looked for (unless
    ``warn_if_no_head=False``), not an error. TypeError when ``model`` is
    not an ``nn.Module``; ValueError for an option out of range.
    """
    where = "torch_offload.get_act_offloading_ctx_manager"
    check_module(where, model)
    if not enable_activation_offloading:
        return contextlib.nullcontext()
    return trl_ctx_manager(
        where,
        model,
        use_pin_memory=use_pin_memory,
        use_streams=use_streams,
        min_offload_size=min_offload_size,
        max_fwd_stash_size=max_fwd_stash_size,
        warn_if_no_head=warn_if_no_head,
        make=OffloadActivations,
    )


# Per peer package: its own objects that install_into replaced, by name.
_replaced = {}


def _peer_modules(packages):
    """The imported modules of `packages` (names and their submodules)."""
    for name, module in list(sys.modules.items()):
        if module is not None and any(name == p or name.startswith(p + ".") for p in packages):
            yield module


def _swap(packages, old, new):
    for module in _peer_modules(packages):
        names = vars(module)
        for name, value in new.items():
            if name in old and names.get(name) is old[name]:
                setattr(module, name, value)


def peer_names(offload_activations, no_op_manager, get_ctx_manager):
    """The three names a peer exports, mapped to ours (for install_into)."""
    return {
        "OffloadActivations": offload_activations,
        "NoOpManager": no_op_manager,
        "get_act_offloading_ctx_manager": get_ctx_manager,
    }


def install_into(where, package, homes, ours, also=()):
    """Points a peer's own code at ours: in `homes` (the modules the peer's
    callers import the names from, imported here) and in every imported
    module of `package` (and of the packages in `also`) that holds the
    peer's object under one of the names in `ours` (a dict name -> ours),
    that object is replaced by ours. Idempotent. ImportError naming
    `where` when the peer is not importable."""
    try:
        modules = [importlib.import_module(home) for home in homes]
    except ImportError as e:
        raise ImportError(f"{where}: {package} is not importable here ({e})") from None
    originals = _replaced.setdefault(package, {})
    for name in ours:
        if name not in originals:
            originals[name] = getattr(modules[0], name)
    for module in modules:
        for name, value in ours.items():
            if hasattr(module, name):  # a lazy package exports some of them only
                setattr(module, name, value)
    _swap((package, *also), originals, ours)


def uninstall_from(package, ours, also=()):
    """Undoes install_into: the peer's own objects back where ours are."""
    originals = _replaced.pop(package, None)
    if originals is not None:
        _swap((package, *also), ours, originals)
