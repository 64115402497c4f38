# SPDX-License-Identifier: MIT
"""What every family of the distributed suites shares (dist_worker.py runs
a rank; dist_parallel.py and dist_worker.py hold the families' runs): the
bitwise comparison, the parameter watch on the manager's pack hook, and
forward + backward under ``with manager:`` at either place of backward."""

import contextlib

import torch

SYNCS = ("blocking", "streamed")
PLACES = ("inside", "outside")
STEPS = 3


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def bits(t):
    return local(t).detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def inner_tensors(t):
    """The plain tensors holding `t`'s data: `t` itself, or for a wrapper
    subclass (DTensor, ...) its inner tensors (``__tensor_flatten__``),
    recursively."""
    if type(t) is torch.Tensor or not hasattr(t, "__tensor_flatten__"):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [leaf for name in names for leaf in inner_tensors(getattr(t, name))]


def parameter_storages(model):
    """Storages of the module's parameters now (DTensor: its local tensor)."""
    return {leaf.untyped_storage().data_ptr() for p in model.parameters() for leaf in inner_tensors(p)}


class Watch:
    """Wraps a Manager's pack hook: for each saved tensor it offloaded (its
    tensors_offloaded counter moved during that pack), records whether a
    storage of it (a subclass: of its inner tensors) is a parameter's of
    `model` at that moment, and counts the saved subclasses offloaded."""

    def __init__(self, manager, model):
        self.parameter_hits = []
        self.subclass_offloads = 0  # saved wrapper subclasses (DTensor) of which something was offloaded
        pack = manager._pack

        def watched(tensor):
            before = manager.stats().tensors_offloaded
            handle = pack(tensor)
            if manager.stats().tensors_offloaded > before:
                if type(tensor) is not torch.Tensor and hasattr(tensor, "__tensor_flatten__"):
                    self.subclass_offloads += 1
                storages = parameter_storages(model)
                if any(leaf.untyped_storage().data_ptr() in storages for leaf in inner_tensors(tensor)):
                    self.parameter_hits.append(tuple(tensor.shape))
            return handle

        manager._pack = watched


def forward_backward(loss_fn, manager, place):
    with manager if manager else contextlib.nullcontext():
        loss = loss_fn()
        if place == "inside":
            loss.backward()
    if place == "outside":
        loss.backward()
    return loss


def compare(reference, got):
    """None when `got` is bitwise `reference` (lists of tensors), else what differs."""
    if len(reference) != len(got):
        return f"{len(got)} tensors recorded, reference has {len(reference)}"
    for i, (a, b) in enumerate(zip(reference, got, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(bits(a), bits(b)):
            return (
                f"tensor {i} of {len(got)} differs (shape {tuple(b.shape)}; first values {local(b).flatten()[:3]} "
                f"vs reference {local(a).flatten()[:3]})"
            )
    return None
