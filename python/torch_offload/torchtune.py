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
    keep_on_device,
    warn_no_head,
)

__all__ = ["OffloadActivations", "NoOpManager", "get_act_offloading_ctx_manager"]


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
