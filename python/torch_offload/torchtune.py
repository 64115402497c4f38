# SPDX-License-Identifier: MIT
"""torchtune 0.6.1's activation offloading (``torchtune.training``), served
by torch-offload's managers: the same names, signatures and defaults, so
that switching is one import line::

    # from torchtune.training import OffloadActivations, NoOpManager, get_act_offloading_ctx_manager
    from torch_offload.torchtune import OffloadActivations, NoOpManager, get_act_offloading_ctx_manager

What differs from torchtune 0.6.1 (docs/python.md): any accelerator, not
only CUDA; the model's parameters and buffers (frozen ones too) are never
offloaded; a multimodal model (``decoder``, no ``output``) is offloaded
with ``decoder.output`` kept on the device where torchtune raises
NotImplementedError; the no-head warning goes through ``warnings`` (naming
the search); a model that is not an ``nn.Module`` is a TypeError.
"""

import contextlib

from ._peers import (
    TORCHTUNE_HEAD_SEARCH,
    TORCHTUNE_HEADS,
    NoOpManager,
    PeerOffload,
    check_module,
    find_head,
    install_into,
    keep_on_device,
    peer_names,
    uninstall_from,
    warn_no_head,
)

__all__ = ["OffloadActivations", "NoOpManager", "get_act_offloading_ctx_manager", "install", "uninstall"]


class OffloadActivations(PeerOffload):
    """torchtune 0.6.1's ``OffloadActivations(use_pin_memory=True,
    use_streams=True, max_fwd_stash_size=5, min_offload_size=1024)`` (note
    the order: ``max_fwd_stash_size`` third), a torch_offload Manager on the
    detected accelerator. ``use_streams=None`` is True. Arguments as
    ``torch_offload.trl.OffloadActivations``; ValueError when
    ``max_fwd_stash_size`` < 1.
    """

    def __init__(self, use_pin_memory=True, use_streams=True, max_fwd_stash_size=5, min_offload_size=1024):
        super().__init__(
            use_pin_memory=use_pin_memory,
            use_streams=use_streams,
            min_offload_size=min_offload_size,
            max_fwd_stash_size=max_fwd_stash_size,
        )


def output_head(model):
    """The module torchtune 0.6.1 keeps on the device: ``model.output`` when
    it is an ``nn.Module``, else ``model.output.linear`` (a ``TiedLinear``:
    not a module, its ``linear`` is); for a model with ``decoder`` and no
    ``output``, ``decoder.output``. None when there is none."""
    return find_head(model, TORCHTUNE_HEAD_SEARCH)


def get_act_offloading_ctx_manager(model, enable_activation_offloading):
    """torchtune 0.6.1's ``get_act_offloading_ctx_manager(model,
    enable_activation_offloading)``, as its recipes call it.

    True: an ``OffloadActivations()`` (torchtune's defaults) with the
    model's parameters and buffers excluded, whose output head
    (``output_head``) runs without offloading; no head: a UserWarning
    naming what was looked for. False: ``contextlib.nullcontext()``.
    TypeError when ``model`` is not an ``nn.Module``.
    """
    where = "torch_offload.torchtune.get_act_offloading_ctx_manager"
    check_module(where, model)
    if not enable_activation_offloading:
        return contextlib.nullcontext()
    manager = OffloadActivations()
    manager.exclude(model.parameters())
    manager.exclude(model.buffers())
    head = output_head(model)
    if head is None:
        warn_no_head(where, TORCHTUNE_HEADS, "", stacklevel=2)
    else:
        keep_on_device([head])
    return manager


def _ours():
    return peer_names(OffloadActivations, NoOpManager, get_act_offloading_ctx_manager)


def install():
    """Makes torchtune's own code use these names, so that a recipe's
    ``enable_activation_offloading: True`` (the recipes call
    ``training.get_act_offloading_ctx_manager(model, enabled)``) gets a
    ``torch_offload.torchtune.OffloadActivations``: replaces torchtune's
    ``OffloadActivations``, ``NoOpManager`` and
    ``get_act_offloading_ctx_manager`` in ``torchtune.training`` and
    ``torchtune.training._activation_offloading`` and in every ``torchtune``
    or ``recipes`` module already imported. Idempotent; ImportError when
    torchtune is not importable. ``uninstall()`` undoes it. (The recipes'
    own check that the device is CUDA stays theirs.)"""
    install_into(
        "torch_offload.torchtune.install",
        "torchtune",
        ("torchtune.training._activation_offloading", "torchtune.training"),
        _ours(),
        also=("recipes",),
    )


def uninstall():
    """Gives torchtune its own names back where ``install()`` put ours."""
    uninstall_from("torchtune", _ours(), also=("recipes",))
