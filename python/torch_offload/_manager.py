# SPDX-License-Identifier: MIT
"""torch_offload.Manager, no_offload and Stats."""

import dataclasses
import operator
import threading

import torch

from . import _C

Stats = dataclasses.make_dataclass(
    "Stats",
    [(name, int, dataclasses.field(default=0, metadata={"doc": doc})) for name, doc in _C.stat_fields()],
    frozen=True,
    namespace={
        "passed_through": property(
            lambda self: self.passed_other_device + self.passed_small + self.passed_excluded
            + self.passed_leaf + self.passed_layout + self.passed_budget + self.passed_target,
            doc="Saved tensors that stayed on their device or host, all reasons.",
        ),
        "__module__": __name__,
    },
)
Stats.__doc__ = """What a Manager did, as counters (C++ offload::Stats, same field names).

All byte counts are bytes of the underlying storages; each field's
``metadata["doc"]`` says what it counts. A frozen snapshot:
``manager.stats()`` returns a new one each call. ``passed_through`` sums
the ``passed_*`` reasons.
"""


def _tensors_in(tensors):
    """The tensors of an iterable, as a list; TypeError for anything else."""
    def refuse(what):
        return TypeError("torch_offload.Manager.exclude: expected tensors (or an iterable of them), got "
                         f"{type(what).__name__}")
    try:
        items = list(tensors)
    except TypeError:
        raise refuse(tensors) from None
    for t in items:
        if not isinstance(t, torch.Tensor):
            raise refuse(t)
    return items


def _local(t):
    """The tensor holding ``t``'s storage: a DTensor's local tensor, else ``t``."""
    local = getattr(t, "_local_tensor", None)  # torch.distributed.tensor.DTensor
    return local if isinstance(local, torch.Tensor) else t


class _HookRegion:
    """Pushes saved_tensors_hooks(pack, unpack) on enter, pops on exit.

    Re-enterable and nestable; the stack of open regions is per thread, like
    saved_tensors_hooks itself (which is thread-local)."""

    def __init__(self, pack, unpack):
        self._pack = pack
        self._unpack = unpack
        self._local = threading.local()

    def _open(self):
        stack = self._local.__dict__.setdefault("stack", [])
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        stack.append(hooks)

    def _close(self, *exc):
        stack = getattr(self._local, "stack", None)
        if not stack:
            raise RuntimeError(
                f"{type(self).__name__}.__exit__ on a thread where it is not open "
                "(a region is closed on the thread that opened it)"
            )
        stack.pop().__exit__(*exc)


class Manager(_HookRegion):
    """An activation-offload manager: ``with manager:`` routes the tensors
    autograd saves on this thread through it.

    Args:
        device: ``"auto"`` (the accelerator LibTorch detects; see
            ``fallback``), ``"cuda"``, ``"xpu"``, ``"npu"``, ``"neuron"``,
            ``"sim"`` (after ``torch_offload.sim.install()``), or the name of
            any registered PrivateUse1 backend (generic c10 policy); a
            ``torch.device`` or ``"type:index"`` names its type (one manager
            serves every index of a device type, and each tensor comes back
            to the index it left).
        storage: ``"pinned_host"`` (page-locked host memory) or
            ``"pageable_host"``.
        sync: ``"streamed"`` (side copy stream, forward stash, backward
            prefetch; falls back to blocking copies, visibly, on a device
            without streams/events) or ``"blocking"``.
        min_offload_bytes: storages smaller than this stay put, [0, 2**50].
        max_fwd_stash: streamed: how many of the last offloaded tensors
            stay on the device after forward copied them (their copies
            overlap compute; one still stashed when backward needs it is
            reused without a copy back), [1, 1024].
        prefetch_depth: streamed: how far ahead backward brings tensors
            back, in units of the largest offloaded storage (small saved
            tensors fill the window without a slot each), [0, 1024].
        prefetch_bytes: streamed: a fixed prefetch window in bytes instead,
            0 = follow prefetch_depth, [0, 2**50].
        pin_memory: whether pinned_host may page-lock (a bool).
        host_budget_bytes: most host bytes held, 0 = unlimited, [0, 2**50].
        device_target_bytes: a device-memory target: the allocated device
            memory (``memory_allocated``) each ``with`` (one step) should
            stay under; the manager offloads only what the previous step
            showed is needed, the earliest saved first (the first step
            offloads everything), 0 = off, [0, 2**50].
        fallback: when the device is not there (``"auto"`` finding no
            usable accelerator, or a named device this build or machine
            lacks), ``"error"`` raises RuntimeError, ``"pass_through"``
            returns a manager that offloads nothing (its repr says why).

    Raises ValueError for an option out of range (same text as the C++
    ``offload::Options``) or an unknown name (listing the accepted ones),
    before anything is built; RuntimeError when the device is not there.

    A tensor is offloaded when it is on the manager's device type, strided,
    not a parameter (a floating-point or complex leaf, whether it requires
    grad or not, or a view of one), not excluded,
    and its storage has at least ``min_offload_bytes``. Backward may run
    after the ``with`` has closed. ``with`` regions are per thread and
    nestable; every method is thread-safe. pack and unpack run in C++ with
    the GIL released.
    """

    def __init__(self, device="auto", storage="pinned_host", sync="streamed", *, min_offload_bytes=1024,
                 max_fwd_stash=5, prefetch_depth=2, prefetch_bytes=0, pin_memory=True, host_budget_bytes=0,
                 device_target_bytes=0, fallback="error"):
        if isinstance(device, torch.device):
            device = device.type
        elif isinstance(device, str) and device.partition(":")[2].isdigit():
            device = device.partition(":")[0]  # "cuda:1": the manager serves every index
        if pin_memory not in (True, False):
            raise TypeError(f"torch_offload.Manager: pin_memory must be a bool, got {type(pin_memory).__name__}")
        for name, value in (("device", device), ("storage", storage), ("sync", sync), ("fallback", fallback)):
            if not isinstance(value, str):
                raise TypeError(f"torch_offload.Manager: {name} must be a str, got {type(value).__name__}")
        options = {"min_offload_bytes": min_offload_bytes, "max_fwd_stash": max_fwd_stash,
                   "prefetch_depth": prefetch_depth, "prefetch_bytes": prefetch_bytes,
                   "host_budget_bytes": host_budget_bytes, "device_target_bytes": device_target_bytes}
        for name, lo, hi, _ in _C.option_fields():
            value = options[name]
            if isinstance(value, bool):
                raise TypeError(f"torch_offload.Manager: {name} must be an int, got bool")
            try:
                value = operator.index(value)  # int, numpy and torch integers
            except TypeError:
                raise TypeError(f"torch_offload.Manager: {name} must be an int, got {type(value).__name__}") from None
            if not lo <= value <= hi:  # the C++ message, also for values beyond int64
                raise ValueError(f"offload::Options: {name} must be in [{lo}, {hi}], got {value}")
            options[name] = value
        impl = _C.Manager(device, storage, sync, options, bool(pin_memory), fallback)
        super().__init__(impl.pack_hook(), _C.unpack)
        self._impl = impl
        self._requested = device
        self._marks = threading.local()  # per thread: what the manager had seen at each open `with`

    def __enter__(self):
        self._open()
        marks = getattr(self._marks, "stack", None)
        if marks is None:
            marks = self._marks.stack = []
        marks.append(self._impl.on_scope_enter())
        return self

    def __exit__(self, *exc):
        self._close(*exc)
        self._impl.on_scope_exit(self._marks.stack.pop(), True)
        return False

    def stats(self):
        """A Stats snapshot (thread-safe)."""
        return Stats(**dict(self._impl.stats()))

    def reset_stats(self):
        """Zeroes the counters; host bytes in use are kept (thread-safe)."""
        self._impl.reset_stats()

    def exclude(self, tensors):
        """Never offload tensors sharing storage with any of ``tensors`` (a
        tensor or an iterable of tensors, e.g. ``model.buffers()``). A
        DTensor stands for its local tensor's storage. Parameters (floating-
        point or complex leaves and their views) are never offloaded anyway.

        Raises TypeError naming the type of anything that is not a tensor,
        before anything is excluded (thread-safe)."""
        items = [tensors] if isinstance(tensors, torch.Tensor) else _tensors_in(tensors)
        self._impl.exclude([_local(t) for t in items])

    @property
    def options(self):
        """The validated options, as a dict."""
        return self._impl.options()

    def describe(self):
        """Which C++ manager was chosen, e.g. ``Manager<sim, pinned_host, streamed>``,
        with the dispatcher's note in brackets when it had to adapt."""
        return self._impl.describe()

    def __repr__(self):
        how = "detected" if self._requested == "auto" else "requested"
        return f"torch_offload.Manager({self.describe()}; device {how}: {self._requested!r})"


class no_offload(_HookRegion):
    """Inside it, saved tensors of this thread stay where they are, even
    inside an open Manager (like torchtune's NoOpManager). Autograd's check
    for in-place changes to saved tensors still applies. Re-enterable."""

    def __init__(self):
        super().__init__(_C.plain_pack, _C.unpack)

    def __enter__(self):
        # None, as saved_tensors_hooks: TRL and torchtune enter it from a
        # forward pre-hook and leave it from a forward hook, where a return
        # value would replace the module's input or output.
        self._open()

    def __exit__(self, *exc):
        self._close(*exc)
