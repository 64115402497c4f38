# SPDX-License-Identifier: MIT
"""Drop-in names for TRL's and torchtune's activation offloading:
``from torch_offload import OffloadActivations, NoOpManager,
get_act_offloading_ctx_manager`` replaces ``from trl.models import ...`` or
``from torchtune.training import ...``; same arguments, same meaning."""

import warnings

from ._manager import Manager, no_offload


class OffloadActivations(Manager):
    """TRL's / torchtune's ``OffloadActivations``, served by a Manager.

    Args (the peers' names and meaning):
        use_pin_memory: host copies in page-locked memory (storage
            ``"pinned_host"`` with ``pin_memory``), else ``"pageable_host"``.
        use_streams: a side copy stream with forward stash and backward
            prefetch (sync ``"streamed"``); ``False`` copies on the compute
            stream (``"blocking"``). ``None`` (torchtune's default) is True.
        min_offload_size: tensors whose storage is smaller than this many
            bytes stay on the device.
        max_fwd_stash_size: how many tensors may be in flight to the host
            in forward; at least 1 (ValueError otherwise).

    The device is the detected accelerator (``device="auto"``). Raises like
    Manager. Use as ``with OffloadActivations(): loss = model(x)``.
    """

    def __init__(self, use_pin_memory=True, use_streams=True, min_offload_size=1024, max_fwd_stash_size=5):
        streams = True if use_streams is None else bool(use_streams)
        super().__init__(
            "auto",
            "pinned_host" if use_pin_memory else "pageable_host",
            "streamed" if streams else "blocking",
            min_offload_bytes=min_offload_size,
            max_fwd_stash=max_fwd_stash_size,
            pin_memory=bool(use_pin_memory),
        )


class NoOpManager(no_offload):
    """torchtune's / TRL's ``NoOpManager``: inside it, saved tensors stay
    where they are even within an OffloadActivations region."""


def _output_head(model):
    """The module whose activations stay on the device, found as TRL does:
    the model (unwrapped from ``.module`` and PEFT's ``.base_model``), then
    its ``output``, ``lm_head``, ``decoder.output``/``decoder.lm_head`` or
    ``final_layer``. None when there is none."""
    unwrapped = getattr(model, "module", model)
    if hasattr(unwrapped, "base_model") and hasattr(unwrapped, "peft_config"):
        unwrapped = unwrapped.base_model
    for path in (("output",), ("lm_head",), ("decoder", "output"), ("decoder", "lm_head"), ("final_layer",)):
        found = unwrapped
        for name in path:
            found = getattr(found, name, None)
            if found is None:
                break
        if found is not None:
            return found
    return None


def get_act_offloading_ctx_manager(model, enable_activation_offloading=True, *, use_pin_memory=True,
                                   use_streams=True, min_offload_size=1024, max_fwd_stash_size=5,
                                   warn_if_no_head=True):
    """TRL's / torchtune's ``get_act_offloading_ctx_manager``.

    Returns an OffloadActivations for ``model`` with the model's parameters
    and buffers excluded, whose output head (see the TRL lookup in
    ``_output_head``) runs without offloading (its forward pre-hook opens a
    NoOpManager, its forward hook closes it): the head's activations are
    needed first in backward, so offloading them only costs time. With
    ``enable_activation_offloading=False`` (torchtune's switch) returns a
    ``contextlib.nullcontext()``. Warns when no head is found and
    ``warn_if_no_head``.
    """
    if not enable_activation_offloading:
        import contextlib

        return contextlib.nullcontext()
    manager = OffloadActivations(use_pin_memory=use_pin_memory, use_streams=use_streams,
                                 min_offload_size=min_offload_size, max_fwd_stash_size=max_fwd_stash_size)
    manager.exclude(model.parameters())
    manager.exclude(model.buffers())
    head = _output_head(model)
    if head is not None:
        noop = NoOpManager()

        def open_noop(*args):  # hooks return None: the head's input and output stay as they are
            noop.__enter__()

        def close_noop(*args):
            noop.__exit__(None, None, None)

        head.register_forward_pre_hook(open_noop)
        head.register_forward_hook(close_noop, always_call=True)
    elif warn_if_no_head:
        warnings.warn("torch_offload.get_act_offloading_ctx_manager: no output head found (output, lm_head, "
                      "decoder.output, decoder.lm_head, final_layer); every activation is offloaded",
                      stacklevel=2)
    return manager
