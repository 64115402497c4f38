# SPDX-License-Identifier: MIT
"""torch_offload.CheckpointOffload: activation checkpointing whose saved
block inputs go through a torch_offload Manager (Hugging Face's
``gradient_checkpointing_func`` convention), and enable_gradient_checkpointing."""

import functools

import torch
import torch.utils.checkpoint

from ._manager import Manager


class CheckpointOffload:
    """A ``gradient_checkpointing_func``: ``fn(function, *args, **kwargs)``
    runs ``torch.utils.checkpoint.checkpoint(function, *args,
    use_reentrant=False, **kwargs)`` inside ``with manager:``.

    Non-reentrant checkpoint saves the block's inputs before it opens its own
    saved-tensor hooks, so exactly those inputs go through the manager
    (offloaded; with ``sync="streamed"`` the copies overlap compute and
    backward prefetches the next block's input while the current block is
    recomputed); what the block saves is held by checkpoint's hooks (nothing
    in forward, the recomputed tensors for one block in backward), never by
    the manager. Gradients are bitwise those of ``torch.utils.checkpoint``
    without offloading.

    Args:
        manager: the Manager to offload through; default
            ``Manager(sync="streamed")`` (the detected accelerator).
        **checkpoint_kwargs: passed to ``torch.utils.checkpoint.checkpoint``
            (``preserve_rng_state``, ``determinism_check``, ...);
            ``use_reentrant`` must be False (the reentrant variant runs the
            block under no_grad and saves its inputs itself, so the manager
            would not see them as inputs).

    Raises:
        ValueError: ``use_reentrant=True``.
        TypeError: ``manager`` is not a torch_offload.Manager.
    """

    def __init__(self, manager=None, **checkpoint_kwargs):
        if checkpoint_kwargs.get("use_reentrant", False):
            raise ValueError(
                "CheckpointOffload: use_reentrant must be False (non-reentrant checkpoint saves the block's "
                "inputs through the manager), got True"
            )
        if manager is not None and not isinstance(manager, Manager):
            raise TypeError(f"CheckpointOffload: manager must be a torch_offload.Manager, got {type(manager).__name__}")
        self.manager = manager if manager is not None else Manager(sync="streamed")
        self._kwargs = {**checkpoint_kwargs, "use_reentrant": False}

    def __call__(self, function, *args, **kwargs):
        with self.manager:
            return torch.utils.checkpoint.checkpoint(function, *args, **self._kwargs, **kwargs)

    def __repr__(self):
        return f"CheckpointOffload({self.manager!r})"


def enable_gradient_checkpointing(model, manager=None, every_n_layers=1, **checkpoint_kwargs):
    """Turns on gradient checkpointing of a Hugging Face model with each
    checkpointed layer's input offloaded through ``manager``; returns the
    CheckpointOffload (its ``.manager`` has the stats).

    Calls ``model.activation_checkpointing_enable(...)`` (transformers 5;
    ``gradient_checkpointing_enable`` before it) with ``use_reentrant=False``,
    so the model's own bookkeeping (input gradients for PEFT, ...) is done,
    then ``model._set_gradient_checkpointing(enable=True,
    gradient_checkpointing_func=<the CheckpointOffload>)``, which hands it to
    every module with a ``gradient_checkpointing`` attribute. A model without
    these methods (plain torch.nn modules following the same convention)
    gets the attributes set directly. ``every_n_layers`` is passed on where
    the model takes it.
    """
    func = CheckpointOffload(manager, **checkpoint_kwargs)
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every_n_layers)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if hasattr(model, "_set_gradient_checkpointing"):
        import inspect

        more = (
            {"every_n_layers": every_n_layers}
            if "every_n_layers" in inspect.signature(model._set_gradient_checkpointing).parameters
            else {}
        )
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=func, **more)
    else:
        for module in model.modules():
            if hasattr(module, "gradient_checkpointing"):
                module._gradient_checkpointing_func = func
                module.gradient_checkpointing = True
    return func


# The same without offloading, for comparisons: what HF's default
# (use_reentrant=False) gradient_checkpointing_func is.
plain_checkpoint = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
