# SPDX-License-Identifier: MIT
"""torch_offload: activation offloading for PyTorch training loops.

The tensors autograd saves for backward inside ``with manager:`` are copied
to host memory and their device memory is released; backward brings them
back (prefetched) to exactly the device they came from. Losses and
gradients are bitwise those of the same run without offloading. The
decisions, copies, streams and accounting are torch-offload's C++ managers;
Python only carries an opaque handle per saved tensor.

    import torch_offload
    manager = torch_offload.Manager()          # the detected accelerator
    manager.exclude(model.buffers())          # constant buffers stay (parameters always do)
    with manager:
        loss = model(x).sum()
    loss.backward()

Drop-ins, one import line each: ``torch_offload.trl`` mirrors TRL 1.16.0's
``trl.models.activation_offloading``, ``torch_offload.torchtune`` mirrors
torchtune 0.6.1's ``torchtune.training`` (``OffloadActivations``,
``NoOpManager``, ``get_act_offloading_ctx_manager``, each with its peer's
signature). The top-level names of the same three follow TRL, with every
argument on which the two peers' positional orders disagree taken by name
only. Checkpointing with offloaded inputs, as a Hugging Face
``gradient_checkpointing_func``: ``CheckpointOffload``,
``enable_gradient_checkpointing``. The simulated accelerator:
``torch_offload.sim``. See docs/python.md.
"""

import torch as _torch

from ._build_info import TORCH_VERSION as _BUILT_WITH, VERSION as __version__

if _torch.__version__ != _BUILT_WITH:
    raise ImportError(
        f"torch_offload was built against torch {_BUILT_WITH} but this process imported torch "
        f"{_torch.__version__}; rebuild it against this torch (pip install --no-build-isolation .)"
    )

from . import torchtune, trl  # noqa: E402,F401  (torch_offload.trl / torch_offload.torchtune)
from ._checkpoint import (  # noqa: E402
    CheckpointOffload,
    PlannedCheckpoint,
    PlannedModuleList,
    enable_gradient_checkpointing,
    plain_checkpoint,
)
from ._manager import Manager, OffloadWarning, Stats, no_offload, pool_stats, pool_trim  # noqa: E402
from ._peers import NoOpManager, OffloadActivations, get_act_offloading_ctx_manager  # noqa: E402
from ._report import ModuleRow, Report  # noqa: E402

__all__ = [
    "Manager",
    "OffloadWarning",
    "Stats",
    "no_offload",
    "CheckpointOffload",
    "PlannedCheckpoint",
    "PlannedModuleList",
    "enable_gradient_checkpointing",
    "plain_checkpoint",
    "OffloadActivations",
    "NoOpManager",
    "get_act_offloading_ctx_manager",
    "pool_stats",
    "pool_trim",
    "Report",
    "ModuleRow",
    "__version__",
]
