# SPDX-License-Identifier: MIT
"""TRL 1.16.0's activation offloading (``trl.models.activation_offloading``),
served by torch-offload's managers: the same names, signatures, defaults and
public methods, so that switching is one import line::

    # from trl.models.activation_offloading import OffloadActivations, NoOpManager, get_act_offloading_ctx_manager
    from torch_offload.trl import OffloadActivations, NoOpManager, get_act_offloading_ctx_manager

What differs from TRL 1.16.0 (docs/python.md): ``update_model_params``
adds to the excluded storages instead of replacing them, and excludes
buffers too; the no-head warning goes through ``warnings`` (naming the
search) instead of accelerate's logger; a head attribute that is not an
``nn.Module`` counts as no head instead of raising AttributeError; a model
that is not an ``nn.Module`` is a TypeError. TRL's private state
(``tracker``, the stashes, ``s0``/``s1``) does not exist.
"""

from ._peers import ModelParams, NoOpManager, PeerOffload, install_into, peer_names, trl_ctx_manager, uninstall_from

__all__ = ["OffloadActivations", "NoOpManager", "get_act_offloading_ctx_manager", "install", "uninstall"]


class OffloadActivations(ModelParams, PeerOffload):
    """TRL 1.16.0's ``OffloadActivations(use_pin_memory=True, use_streams=True,
    min_offload_size=1024, max_fwd_stash_size=5)``, a torch_offload Manager
    on the detected accelerator.

    ``use_pin_memory``: pinned host copies (else pageable); ``use_streams``:
    side copy stream with forward stash and backward prefetch (else copies
    on the compute stream); ``min_offload_size``: storages smaller than this
    many bytes stay on the device; ``max_fwd_stash_size``: at least 1
    (ValueError otherwise). ``update_model_params(model)``: never offload
    the model's parameters and buffers.
    """

    public_name = "torch_offload.trl.OffloadActivations"

    def __init__(self, use_pin_memory=True, use_streams=True, min_offload_size=1024, max_fwd_stash_size=5):
        super().__init__(
            use_pin_memory=use_pin_memory,
            use_streams=use_streams,
            min_offload_size=min_offload_size,
            max_fwd_stash_size=max_fwd_stash_size,
        )


def get_act_offloading_ctx_manager(
    model, use_pin_memory=True, use_streams=True, min_offload_size=1024, max_fwd_stash_size=5, warn_if_no_head=True
):
    """TRL 1.16.0's ``get_act_offloading_ctx_manager``: an
    ``OffloadActivations`` with ``update_model_params(model)`` applied, whose
    output head and Liger modules (found as TRL finds them: after unwrapping
    ``.module`` and PEFT's ``.base_model``, the first of ``output`` (or
    ``output.linear``), ``lm_head``, ``decoder.output`` / ``decoder.lm_head``,
    ``final_layer_norm`` / ``ln_f``, ``head``; and every module whose name
    contains ``liger``) run without offloading. No head: a UserWarning
    naming the search, unless ``warn_if_no_head=False``. TypeError when
    ``model`` is not an ``nn.Module``; ValueError for an option out of range.
    """
    return trl_ctx_manager(
        "torch_offload.trl.get_act_offloading_ctx_manager",
        model,
        use_pin_memory=use_pin_memory,
        use_streams=use_streams,
        min_offload_size=min_offload_size,
        max_fwd_stash_size=max_fwd_stash_size,
        warn_if_no_head=warn_if_no_head,
        make=OffloadActivations,
    )


def _ours():
    return peer_names(OffloadActivations, NoOpManager, get_act_offloading_ctx_manager)


def install():
    """Makes TRL's own code use these names, so that a trainer's
    ``activation_offloading=True`` (``SFTTrainer``, and ``DPOTrainer``,
    ``KTOTrainer``, ``RewardTrainer``, which call the same function) gets a
    ``torch_offload.trl.OffloadActivations``: replaces TRL's
    ``OffloadActivations``, ``NoOpManager`` and
    ``get_act_offloading_ctx_manager`` in ``trl.models`` and
    ``trl.models.activation_offloading`` (where TRL's modules import them
    from) and in every ``trl`` module already imported. Call it once,
    before making the trainer; idempotent. ImportError when TRL is not
    importable. ``uninstall()`` undoes it."""
    install_into("torch_offload.trl.install", "trl", ("trl.models.activation_offloading", "trl.models"), _ours())


def uninstall():
    """Gives TRL its own ``OffloadActivations``, ``NoOpManager`` and
    ``get_act_offloading_ctx_manager`` back where ``install()`` put ours."""
    uninstall_from("trl", _ours())
