# SPDX-License-Identifier: MIT
"""torch_offload.Manager, no_offload and Stats."""

import dataclasses
import operator
import threading
import warnings

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from . import _C, _report

OffloadWarning = _C.OffloadWarning

_PASSED_THROUGH = tuple(_C.passed_through_fields())

Stats = dataclasses.make_dataclass(
    "Stats",
    [(name, int, dataclasses.field(default=0, metadata={"doc": doc})) for name, doc in _C.stat_fields()],
    frozen=True,
    namespace={
        "passed_through": property(
            lambda self: sum(getattr(self, name) for name in _PASSED_THROUGH),
            doc="Saved tensors that stayed on their device or host, all reasons (C++ Stats::passed_through()).",
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
        return TypeError(
            f"torch_offload.Manager.exclude: expected tensors (or an iterable of them), got {type(what).__name__}"
        )

    try:
        items = list(tensors)
    except TypeError:
        raise refuse(tensors) from None
    for t in items:
        if not isinstance(t, torch.Tensor):
            raise refuse(t)
    return items


def _storage_holders(t):
    """The tensors holding ``t``'s data: a traceable wrapper subclass's inner
    tensors (a DTensor's local tensor, a TwoTensor's two), each by the same
    rule, else ``t``. RuntimeError naming the type where
    ``__tensor_flatten__`` raises."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    try:
        names, _ = t.__tensor_flatten__()
        inner = [getattr(t, name) for name in names]
    except Exception as e:  # the subclass's own code: anything it raises
        raise RuntimeError(
            f"torch_offload.Manager.exclude: cannot find the storage of a {_type_name(type(t))}: its "
            f"__tensor_flatten__ failed ({type(e).__name__}: {e}); nothing was excluded"
        ) from e
    return [x for i in inner for x in _storage_holders(i)]


def _type_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def _types_in(types):
    """``exclude_types`` as a tuple of tensor subclasses; TypeError otherwise."""
    items = (types,) if isinstance(types, (type, str, bytes)) else types
    try:
        items = tuple(items)
    except TypeError:
        items = (types,)
    for cls in items:
        if not (isinstance(cls, type) and issubclass(cls, torch.Tensor)) or cls in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(
                "torch_offload.Manager: exclude_types must be tensor subclasses other than torch.Tensor "
                f"and nn.Parameter (a type or a tuple of them), got {cls!r}"
                + (" (a name, not the type)" if isinstance(cls, str) else "")
            )
    return items


class _Kept:
    """An inner tensor a subclass needs back as the same Python object (see
    _identity_inner): the object, and the handle pack gave for it (counted
    and checked for in-place changes as any tensor that stays)."""

    __slots__ = ("tensor", "handle")

    def __init__(self, tensor, handle):
        self.tensor, self.handle = tensor, handle

    def unpack(self):
        _C.unpack(self.handle)  # autograd's in-place check
        return self.tensor


class _SubclassPacked:
    """What pack returns for a tensor subclass offloaded through its inner
    tensors (``__tensor_flatten__``): each inner tensor's handle (or _Kept),
    and what ``__tensor_unflatten__`` needs to rebuild the same subclass."""

    __slots__ = ("cls", "inner", "ctx", "size", "stride")

    def __init__(self, cls, inner, ctx, size, stride):
        self.cls, self.inner, self.ctx, self.size, self.stride = cls, inner, ctx, size, stride

    def unpack(self):
        inner = {
            name: handle.unpack() if type(handle) is _Kept else _C.unpack(handle) for name, handle in self.inner.items()
        }
        return self.cls.__tensor_unflatten__(inner, self.ctx, self.size, self.stride)


def _identity_inner(t, inner):
    """The names of ``t``'s inner tensors that must come back as the same
    Python objects: where a size of ``t`` is symbolic, those a nested int
    is made from. A jagged nested tensor's ragged size is a nested int made
    per offsets (or lengths) tensor object, so a copy of its offsets would
    rebuild it with another ragged size than the one autograd recorded.
    Where torch's registry of those is not found, every inner tensor of
    such a ``t`` (it then stays whole)."""
    if all(type(s) is int for s in t.size()):
        return ()
    registry = getattr(getattr(torch.nested, "_internal", None), "nested_tensor", None)
    registry = getattr(registry, "_tensor_symint_registry", None)
    if registry is None:
        return tuple(inner)
    return tuple(name for name, x in inner.items() if x in registry)


def _flatten_checked(t):
    """``t.__tensor_flatten__()`` as (inner tensors by name, context), after
    checking that ``__tensor_unflatten__`` rebuilds a tensor of the same
    type, shape and dtype from them; RuntimeError naming the type if not."""
    cls = type(t)
    try:
        names, ctx = t.__tensor_flatten__()
        inner = {name: getattr(t, name) for name in names}
        back = cls.__tensor_unflatten__(inner, ctx, t.size(), t.stride())
        why = None
        if type(back) is not cls or back.shape != t.shape or back.dtype != t.dtype:
            why = (
                f"__tensor_unflatten__ gave a {_type_name(type(back))} of shape {tuple(back.shape)} and dtype "
                f"{back.dtype} for one of shape {tuple(t.shape)} and dtype {t.dtype}"
            )
    except Exception as e:  # the subclass's own code: anything it raises
        why = f"{type(e).__name__}: {e}"
    if why is not None:
        raise RuntimeError(
            f"torch_offload: cannot offload a saved {_type_name(cls)}: its __tensor_flatten__ / "
            f"__tensor_unflatten__ round trip failed ({why}); nothing of it was offloaded. Keep tensors of this type "
            f"on the device with Manager(exclude_types=({cls.__qualname__},))"
        )
    return inner, ctx


def _is_parameter(t):
    """Whether ``t`` (of a type other than torch.Tensor) is a parameter by
    the rule of docs/guide.md: an nn.Parameter (also
    ``nn.Parameter(dtensor)``), a leaf that requires grad (as from C++), or
    a view of either."""
    for x in (t, t._base):
        if x is not None and (isinstance(x, torch.nn.Parameter) or (x.requires_grad and x.is_leaf)):
            return True
    return False


class _SubclassRule:
    """How a Manager packs a saved tensor of another Python type than
    torch.Tensor and nn.Parameter (the C++ pack hook calls it): a parameter
    (an nn.Parameter subclass, ``nn.Parameter(dtensor)``, a leaf that
    requires grad, a view of one) stays; a type in ``exclude_types`` stays;
    a traceable wrapper subclass
    (DTensor, TwoTensor, torchao's float8 tensors) is offloaded through its
    inner tensors, each packed by ``pack`` (and so by the same rules), and
    comes back as the same subclass; any other type stays, with one
    OffloadWarning per type."""

    def __init__(self, impl, exclude_types):
        self._impl = impl
        self._exclude_types = exclude_types
        self._warned = set()

    def __call__(self, pack, t):
        if _is_parameter(t):
            return self._impl.pack_passing(t, "parameter")
        if self._exclude_types and isinstance(t, self._exclude_types):
            return self._impl.pack_passing(t, "excluded")
        if is_traceable_wrapper_subclass(t):
            inner, ctx = _flatten_checked(t)
            self._check_nested(inner)  # the whole tree, before anything of it is offloaded
            kept = _identity_inner(t, inner)
            handles = {
                name: _Kept(x, self._impl.pack_passing(x, "subclass")) if name in kept else pack(x)
                for name, x in inner.items()
            }
            return _SubclassPacked(type(t), handles, ctx, t.size(), t.stride())
        cls = type(t)
        if cls not in self._warned:
            self._warned.add(cls)
            warnings.warn(
                f"torch_offload.Manager: saved tensors of type {_type_name(cls)} stay on their device: it is a "
                "tensor subclass without __tensor_flatten__ / __tensor_unflatten__, so the manager could not rebuild "
                "it as the same type after a copy (counted in Stats.passed_subclass; warned once per type and manager)",
                OffloadWarning,
                stacklevel=_C.user_stacklevel(),
            )
        return self._impl.pack_passing(t, "subclass")

    def _check_nested(self, inner):
        """Checks the round trip of every traceable wrapper subclass among
        ``inner`` and theirs, as pack will meet them."""
        for x in inner.values():
            if (
                is_traceable_wrapper_subclass(x)
                and not _is_parameter(x)
                and not (self._exclude_types and isinstance(x, self._exclude_types))
            ):
                self._check_nested(_flatten_checked(x)[0])


_threads = threading.local()  # per thread: the Manager and no_offload regions open, in the order opened


def _open_regions():
    regions = getattr(_threads, "regions", None)
    if regions is None:
        regions = _threads.regions = []
    return regions


class _HookRegion:
    """Pushes torch's default saved-tensor hooks (pack, unpack) on enter,
    pops them on exit, as ``torch.autograd.graph.saved_tensors_hooks`` does.

    Re-enterable and nestable; the regions open are per thread, like the
    hooks themselves (thread-local). An exit closes the latest open of that
    object on its thread. Closed out of order (an outer region while one
    opened inside it is still open), a region removes its own hooks from
    under the inner ones, which stay in force (as a C++ offload::Scope
    does), and says so."""

    def __init__(self, pack, unpack):
        self._pack = pack
        self._unpack = unpack

    def _open(self):
        torch._C._autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
        _open_regions().append(self)

    def _close(self):
        """Pops this region's hooks; returns whether it was the innermost
        hooks region open (in order). torch's stack of default hooks only
        pops its top, so hooks opened inside this region and still open are
        popped first and pushed back after. Regions may share hooks (every
        no_offload does): as many entries of ours are passed over as
        regions with the same hooks were opened after this one."""
        regions = _open_regions()
        at = next((i for i in range(len(regions) - 1, -1, -1) if regions[i] is self), None)
        if at is None:
            raise RuntimeError(
                f"{type(self).__name__}.__exit__ on a thread where it is not open "
                "(a region is closed on the thread that opened it)"
            )
        later = sum(1 for r in regions[at + 1 :] if r._pack is self._pack)
        del regions[at]
        autograd = torch._C._autograd
        above = []
        top = autograd._top_saved_tensors_default_hooks(True)
        while top is not None and (top[0] is not self._pack or later > 0):
            if top[0] is self._pack:
                later -= 1
            above.append(top)
            autograd._pop_saved_tensors_default_hooks()
            top = autograd._top_saved_tensors_default_hooks(True)
        if top is not None:
            autograd._pop_saved_tensors_default_hooks()
        elif above:
            # Ours are gone: a saved_tensors_hooks region opened before this
            # one was closed inside it and popped them. The top goes instead,
            # as a saved_tensors_hooks region would pop it, so pushes and
            # pops balance.
            del above[0]
        for pack, unpack in reversed(above):
            autograd._push_saved_tensors_default_hooks(pack, unpack)
        if top is None:
            warnings.warn(
                f"torch_offload.{type(self).__name__}: its saved-tensor hooks were no longer on torch's stack when "
                "it closed (a saved_tensors_hooks region opened before it was closed inside it); the hooks on top "
                "were removed instead: close regions innermost first",
                OffloadWarning,
                stacklevel=_C.user_stacklevel(),
            )
            return True
        return not above


def _bound(n):
    """A range bound as the docs write it: 2**50 rather than its digits."""
    if n >= 1 << 20 and n & (n - 1) == 0:
        return f"2**{n.bit_length() - 1}"
    return str(n)


def _check_index(device_type, index):
    """A device index the process does not have ("sim:7" with two sim
    devices) is an error naming it, where the device type's module counts
    its devices; the manager itself serves every index of its type."""
    if index is None:
        return
    try:
        count = torch.get_device_module(device_type).device_count()
    except Exception:  # a type with no device module (yet): the manager's own checks speak
        return
    if not 0 <= index < count:
        raise ValueError(
            f"torch_offload.Manager: device {device_type}:{index} is not there: this process has {count} "
            f"{device_type} device{'s' if count != 1 else ''} (indices [0, {count - 1}])"
            if count > 0
            else f"torch_offload.Manager: device {device_type}:{index} is not there: this process has no "
            f"{device_type} device"
        )


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
        storage: ``"pinned_host"`` (page-locked host memory),
            ``"pageable_host"``, or ``"pinned_pool"`` (exact-size pieces of
            large page-locked slabs, one pool per device shared by the
            process's managers: no fresh pinned allocation after the first
            step; ``torch_offload.pool_stats(device)``).
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
        pin_memory: whether pinned_host and pinned_pool may page-lock (a bool).
        host_budget_bytes: most host bytes reserved (stats "host_bytes_reserved":
            each buffer at its allocator's block), 0 = unlimited, [0, 2**50].
        device_target_bytes: a device-memory target: the allocated device
            memory (``memory_allocated``) each ``with`` (one step) should
            stay under; the manager offloads only what the previous step
            showed is needed, the earliest saved first (the first step
            offloads everything), 0 = off, [0, 2**50].
        fallback: when the device is not there (``"auto"`` finding no
            usable accelerator, or a named device this build or machine
            lacks), ``"error"`` raises RuntimeError, ``"pass_through"``
            returns a manager that offloads nothing (its repr says why).
        exclude_types: tensor subclasses whose saved tensors stay where
            they are (counted in ``passed_excluded``), e.g. a subclass whose
            ``__tensor_flatten__`` / ``__tensor_unflatten__`` round trip
            fails (pack raises RuntimeError naming it otherwise); a type or
            a tuple of types.

    Raises ValueError for an option out of range (same text as the C++
    ``offload::Options``) or an unknown name (listing the accepted ones),
    before anything is built; RuntimeError when the device is not there.

    What is offloaded (docs/guide.md, "What is never offloaded"): every
    saved tensor on the manager's device type with a storage of at least
    ``min_offload_bytes``, strided, not excluded, and not a parameter: an
    ``nn.Parameter`` (trainable or frozen, FSDP2's unsharded parameters,
    ``nn.Parameter(dtensor)``), a leaf that requires grad, or a view of
    either. Activations saved inside ``torch.compile`` regions and custom
    autograd Functions are offloaded like eager ones. A traceable wrapper
    subclass (DTensor, float8 tensors) is offloaded through its inner
    tensors and comes back as the same subclass; another tensor subclass
    stays, with one ``OffloadWarning`` per type. Backward may run after the
    ``with`` has closed. ``with`` regions are per thread and nestable;
    every method is thread-safe. pack and unpack run in C++ with the GIL
    released (a tensor subclass's flatten and unflatten run in Python).
    Every warning the manager raises is an ``OffloadWarning``.
    """

    def __init__(
        self,
        device="auto",
        storage="pinned_host",
        sync="streamed",
        *,
        min_offload_bytes=1024,
        max_fwd_stash=5,
        prefetch_depth=2,
        prefetch_bytes=0,
        pin_memory=True,
        host_budget_bytes=0,
        device_target_bytes=0,
        fallback="error",
        exclude_types=(),
    ):
        if isinstance(device, torch.device):
            _check_index(device.type, device.index)
            device = device.type
        elif isinstance(device, str) and device.partition(":")[2].isdigit():
            _check_index(device.partition(":")[0], int(device.partition(":")[2]))
            device = device.partition(":")[0]  # "cuda:1": the manager serves every index
        if not isinstance(pin_memory, bool):  # 1 and 0.0 compare equal to True and False, and are not bools
            raise TypeError(f"torch_offload.Manager: pin_memory must be a bool, got {type(pin_memory).__name__}")
        for name, value in (("device", device), ("storage", storage), ("sync", sync), ("fallback", fallback)):
            if not isinstance(value, str):
                raise TypeError(f"torch_offload.Manager: {name} must be a str, got {type(value).__name__}")
        exclude_types = _types_in(exclude_types)
        options = {
            "min_offload_bytes": min_offload_bytes,
            "max_fwd_stash": max_fwd_stash,
            "prefetch_depth": prefetch_depth,
            "prefetch_bytes": prefetch_bytes,
            "host_budget_bytes": host_budget_bytes,
            "device_target_bytes": device_target_bytes,
        }
        for name, lo, hi, _ in _C.option_fields():
            value = options[name]
            accepted = f"[{_bound(lo)}, {_bound(hi)}]"
            if isinstance(value, bool):
                raise TypeError(f"torch_offload.Manager: {name} must be an int in {accepted}, got bool")
            try:
                value = operator.index(value)  # int, numpy and torch integers
            except TypeError:
                raise TypeError(
                    f"torch_offload.Manager: {name} must be an int in {accepted}, got {type(value).__name__}"
                ) from None
            if not lo <= value <= hi:  # checked here, also for values beyond int64
                raise ValueError(f"torch_offload.Manager: {name} must be in {accepted}, got {value}")
            options[name] = value
        impl = _C.Manager(device, storage, sync, options, bool(pin_memory), fallback)
        super().__init__(impl.pack_hook(_SubclassRule(impl, exclude_types)), _C.unpack)
        self._impl = impl
        self._requested = device
        self._marks = threading.local()  # per thread: what the manager had seen at each open `with`
        self._watch = None  # watch(): per-module accounting for report()
        self._warned_thread = False  # a module ran forward on a thread without a scope (warned once)
        self._arguments = (
            (device, storage, sync),
            {**options, "pin_memory": bool(pin_memory), "fallback": fallback, "exclude_types": exclude_types},
        )

    def __deepcopy__(self, memo):
        """The manager itself: it is a handle on the C++ machinery (streams,
        host memory, what it holds, its plan and statistics), so a deep copy
        of a model that holds one (``enable_gradient_checkpointing``'s
        function, a ``PlannedModuleList``; an EMA copy, a reference model)
        shares it, as it would share a ``torch.cuda.Stream``. Give a copy
        that trains its own manager (one manager per planned model)."""
        return self

    def __reduce__(self):
        """Pickled (``torch.save`` of a model that holds it) as its
        arguments: loading makes a new manager with the same ones, and
        nothing of this one's state (what it holds, its plan, its
        statistics). Loaded where its device is not there (a model saved on
        a GPU machine, loaded on one without), it is made with
        ``fallback="pass_through"`` instead, with an OffloadWarning naming
        the device: the model loads, and that manager offloads nothing."""
        args, kwargs = self._arguments
        return (_unpickle, (type(self), args, kwargs))

    def __copy__(self):
        """The manager itself, as for ``copy.deepcopy``."""
        return self

    def __enter__(self):
        self._open()
        marks = getattr(self._marks, "stack", None)
        if marks is None:
            marks = self._marks.stack = []
        marks.append(self._impl.on_scope_enter())
        if _report.scope_opened(self) and self._watch is not None:
            self._watch.begin_step()
        return self

    def __exit__(self, *exc):
        try:
            in_order = self._close()
            self._impl.on_scope_exit(self._marks.stack.pop(), in_order)
        finally:
            _report.scope_closed(self)
        return False

    def watch(self, model, name=""):
        """Accounts each step's saved tensors to the modules of ``model``
        (an ``nn.Module``: itself and every submodule, by their names in
        ``model.named_modules()``, after ``name.`` where ``name`` is given:
        give one per model when watching several) for ``report()``.
        Forward hooks on each module read the manager's counters at the
        module's start and end: a module's row is what it saved itself, its
        children's rows apart. The counters are the manager's: with scopes
        of it open on several threads at once, a row also counts what the
        other threads saved meanwhile. Costs two counter reads per module
        call while the manager's scope is open on the thread (none
        elsewhere). Watching again adds modules not watched yet;
        ``unwatch()`` removes every hook. A watched model saved with
        ``torch.save`` loads with hooks that do nothing. TypeError when
        ``model`` is not an ``nn.Module`` or ``name`` not a str."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"torch_offload.Manager.watch: model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(name, str):
            raise TypeError(f"torch_offload.Manager.watch: name must be a str, got {type(name).__name__}")
        if self._watch is None:
            self._watch = _report.Watch(self._impl)
        self._watch.watch(model, self._open_here, name)

    def unwatch(self):
        """Removes the hooks ``watch()`` registered (every watched module)
        and what was accounted; ``report()`` then raises until the next
        ``watch()``."""
        if self._watch is not None:
            self._watch.remove()
            self._watch = None

    def report(self):
        """What the last step saved through the manager, per watched module
        (``watch()``): a ``Report`` whose ``rows`` (``ModuleRow``) give, for
        each module, the saved tensors seen and offloaded, the bytes
        offloaded and kept on the device, and how many stayed for each
        reason (the ``passed_*`` counters' reasons, in the rule's order:
        docs/python.md, "Why a tensor stayed"); what no watched module saved
        (the loss, a module called outside the model) is the row
        ``(outside watched modules)``. ``str(report)`` is a table. The last
        step: since the last outermost ``with manager:`` opened (backward
        inside it included; a backward after it is not saved through the
        manager, but a recomputation in it is). RuntimeError before
        ``watch()``."""
        if self._watch is None:
            raise RuntimeError(
                "torch_offload.Manager.report: no module is watched: call manager.watch(model) before the step"
            )
        return self._watch.report()

    def _open_here(self):
        """Whether a ``with`` of this manager is the innermost saved-tensor
        hooks region open on this thread (not under a ``no_offload()``,
        another manager or other saved_tensors_hooks opened inside it)."""
        if not getattr(self._marks, "stack", None):
            return False
        top = torch._C._autograd._top_saved_tensors_default_hooks(True)
        return top is not None and top[0] is self._pack

    def stats(self):
        """A Stats snapshot (thread-safe)."""
        return Stats(**dict(self._impl.stats()))

    def reset_stats(self):
        """Zeroes the counters; host bytes in use are kept (thread-safe)."""
        self._impl.reset_stats()

    def exclude(self, tensors):
        """Never offload tensors sharing storage with any of ``tensors``: a
        tensor, an iterable of tensors (e.g. ``model.buffers()``), or an
        ``nn.Module``, for all its parameters (frozen ones too) and buffers.
        A traceable wrapper subclass stands for its inner tensors' storages (a
        DTensor for its local tensor's). Parameters are never offloaded
        anyway, except a frozen DTensor parameter's ``to_local()``, which
        torch does not link to its parameter: ``exclude(model)`` names it.

        Raises TypeError naming the type of anything that is not a tensor,
        RuntimeError naming the type of a wrapper subclass whose
        ``__tensor_flatten__`` fails, before anything is excluded
        (thread-safe)."""
        if isinstance(tensors, torch.nn.Module):
            items = [*tensors.parameters(), *tensors.buffers()]
        else:
            items = [tensors] if isinstance(tensors, torch.Tensor) else _tensors_in(tensors)
        self._impl.exclude([x for t in items for x in _storage_holders(t)])

    @property
    def options(self):
        """The validated options, as a dict."""
        return self._impl.options()

    def describe(self):
        """Which C++ manager was chosen, e.g. ``Manager<sim, pinned_host, streamed>``,
        with the dispatcher's note in brackets when it had to adapt."""
        return self._impl.describe()

    def __repr__(self):
        described = self.describe()
        if self._requested != "auto":
            return f"torch_offload.{type(self).__name__}({described}; device requested: {self._requested!r})"
        policies = described.partition("<")[2].partition(",")[0] if described.startswith("Manager<") else ""
        found = f"device detected: {policies!r}" if policies else "no device detected"
        return f"torch_offload.{type(self).__name__}({described}; {found})"


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
        if not self._close():
            warnings.warn(
                "torch_offload.no_offload was closed while a region opened after it on the same thread was still "
                "open; it no longer applies, the inner region does: close regions innermost first",
                OffloadWarning,
                stacklevel=_C.user_stacklevel(),
            )


def _pool_device(device):
    device = torch.device(device)
    return str(device if device.index is not None else torch.device(device.type, 0))


def pool_stats(device):
    """What the pinned pool of ``device`` (storage="pinned_pool"; index 0
    when none is given) holds, as a dict of bytes and counts:
    reserved_bytes and peak_reserved_bytes (pinned in slabs), in_use_bytes
    and peak_in_use_bytes (carved out for live host buffers), slabs,
    slab_allocations (slabs pinned since the pool was made: fresh pinned
    allocations), pageable_fallbacks, and numa_node (the host NUMA node its
    slabs were pinned on, -1 when none was placed: docs/guide.md, "NUMA").
    Zeros (numa_node -1) when the device has no pool."""
    return _C.pool_stats(_pool_device(device))


def pool_trim(device):
    """Returns the slabs of ``device``'s pinned pool that hold no live buffer
    to the pinned allocator."""
    _C.pool_trim(_pool_device(device))


def _unpickle(cls, args, kwargs):
    """A pickled Manager (Manager.__reduce__): made again with its
    arguments; where its device is not there and it would raise for that,
    made passing every saved tensor through instead, with a warning."""
    try:
        return cls(*args, **kwargs)
    except (RuntimeError, ValueError) as e:
        # Not there: a RuntimeError advising fallback='pass_through', or a
        # ValueError for a device name no backend registers here (a
        # PrivateUse1 backend's, valid where it was pickled).
        absent = "fallback='pass_through'" in str(e) if isinstance(e, RuntimeError) else "device must be" in str(e)
        if kwargs.get("fallback") != "error" or not absent:
            raise
        why = str(e).removeprefix("torch_offload.Manager: ").split("; pass ")[0]
        warnings.warn(
            f"torch_offload.Manager: loaded where its device {args[0]!r} is not there ({why}); "
            "this manager passes every saved tensor through (offloads nothing)",
            OffloadWarning,
            stacklevel=2,
        )
        manager = cls(*args, **{**kwargs, "fallback": "pass_through"})
        manager._arguments = (args, kwargs)  # pickled again, it asks for its device as it did
        return manager
