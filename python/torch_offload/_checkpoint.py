# SPDX-License-Identifier: MIT
"""torch_offload.CheckpointOffload: activation checkpointing whose saved
block inputs go through a torch_offload Manager (Hugging Face's
``gradient_checkpointing_func`` convention), and enable_gradient_checkpointing."""

import functools
import inspect
import operator
import threading
import time
import warnings
import weakref

import torch
import torch.utils.checkpoint
from torch.multiprocessing.reductions import StorageWeakRef

from . import _C, _report
from ._manager import Manager, OffloadWarning, no_offload


def _checkpoint(function, *args, **kwargs):
    """``torch.utils.checkpoint.checkpoint(function, *args, **kwargs)``.

    Where ``function`` raises, torch's checkpoint leaves its saved-tensor
    hooks pushed: a generator in its frame pops them, and the exception's
    traceback keeps that frame alive while the exception propagates, so an
    enclosing Manager or no_offload would close with hooks above its own
    (out of order, warned). Its frames are cleared here, which closes the
    generator: the hooks are popped now, innermost first."""
    try:
        return torch.utils.checkpoint.checkpoint(function, *args, **kwargs)
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_globals.get("__name__") == "torch.utils.checkpoint":
                try:
                    tb.tb_frame.clear()
                except RuntimeError:  # still running (a frame of a caller): not ours to clear
                    pass
            tb = tb.tb_next
        raise


# torch.utils.checkpoint.checkpoint's own keyword arguments (the rest go to
# the function): its keyword-only parameters, and preserve_rng_state, which
# it takes from **kwargs.
_CHECKPOINT_KEYWORDS = frozenset(
    p.name
    for p in inspect.signature(torch.utils.checkpoint.checkpoint).parameters.values()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
) | {"preserve_rng_state"}


def _checked_checkpoint_kwargs(owner, kwargs):
    """``kwargs`` (a constructor's, for every call of the callable), where
    each names one of checkpoint's own keyword arguments; else TypeError
    naming it and the accepted names (a misspelt one would reach every
    block's function, or be dropped by one taking ``**kwargs``)."""
    unknown = sorted(set(kwargs) - _CHECKPOINT_KEYWORDS)
    if unknown:
        names = ", ".join(map(repr, unknown))
        verb = "is not a keyword argument" if len(unknown) == 1 else "are not keyword arguments"
        raise TypeError(
            f"{owner}: {names} {verb} of torch.utils.checkpoint.checkpoint; accepted: "
            f"{', '.join(sorted(_CHECKPOINT_KEYWORDS))} (keyword arguments for the function go with each call)"
        )
    return kwargs


def _function_kwargs(kwargs):
    """The keyword arguments a block that just runs (not checkpointed) is
    called with: those given at the call, less checkpoint's own."""
    return {k: v for k, v in kwargs.items() if k not in _CHECKPOINT_KEYWORDS}


def _call_kwargs(owner, checkpoint_kwargs, kwargs):
    """The keyword arguments of one checkpoint call: the callable's own, and
    those given at the call (which override them; torch's checkpoint passes
    the ones it does not know to the function). ``use_reentrant=True``
    given at the call raises ValueError, as it does at construction."""
    if kwargs.get("use_reentrant", False):
        raise ValueError(f"{owner}: use_reentrant must be False, got {kwargs['use_reentrant']!r}")
    return {**checkpoint_kwargs, **kwargs}


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
    the manager. A layer whose input came by keyword (Hugging Face passes
    ``partial(forward, self, hidden_states=h, ...)`` and no positional
    argument) gets it positionally, so it is saved and offloaded as well
    (the partial's floating-point keyword tensors that require grad).
    Gradients are bitwise those of ``torch.utils.checkpoint`` without
    offloading.

    Args:
        manager: the Manager to offload through; default
            ``Manager(sync="streamed")`` (the detected accelerator).
        **checkpoint_kwargs: passed to ``torch.utils.checkpoint.checkpoint``
            (``preserve_rng_state``, ``determinism_check``, ...);
            ``use_reentrant`` must be False (the reentrant variant runs the
            block under no_grad and saves its inputs itself, so the manager
            would not see them as inputs).

    Raises:
        ValueError: ``use_reentrant=True`` (here or at a call).
        TypeError: ``manager`` is not a torch_offload.Manager, or a keyword
            argument is not one of checkpoint's own.
    """

    def __init__(self, manager=None, **checkpoint_kwargs):
        _checked_checkpoint_kwargs("CheckpointOffload", checkpoint_kwargs)
        if checkpoint_kwargs.get("use_reentrant", False):
            raise ValueError(
                "CheckpointOffload: use_reentrant must be False (non-reentrant checkpoint saves the block's "
                f"inputs through the manager), got {checkpoint_kwargs['use_reentrant']!r}"
            )
        if manager is not None and not isinstance(manager, Manager):
            raise TypeError(f"CheckpointOffload: manager must be a torch_offload.Manager, got {type(manager).__name__}")
        self.manager = manager if manager is not None else Manager(sync="streamed")
        self._kwargs = {**checkpoint_kwargs, "use_reentrant": False}

    def __call__(self, function, *args, **kwargs):
        run_kwargs = _call_kwargs("CheckpointOffload", self._kwargs, kwargs)
        function, args = _keyword_inputs_positional(function, args, kwargs)
        with self.manager:
            return _checkpoint(function, *args, **run_kwargs)

    def __repr__(self):
        return f"CheckpointOffload({self.manager!r})"


def enable_gradient_checkpointing(model, manager=None, every_n_layers=1, plan=None, **checkpoint_kwargs):
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
    the model takes it. ``plan="auto"``: a PlannedCheckpoint of ``manager``
    (which must have ``device_target_bytes``) instead, so the automatic
    plan keeps, offloads or recomputes each layer; run each step's forward
    inside ``with manager:``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"enable_gradient_checkpointing: model must be a torch.nn.Module, got {type(model).__name__}")
    if plan not in (None, "auto"):
        raise ValueError(f"enable_gradient_checkpointing: plan must be None or 'auto', got {plan!r}")
    try:  # an integer of any kind (numpy's, torch's) but bool
        ok = not isinstance(every_n_layers, bool) and operator.index(every_n_layers) >= 1
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"enable_gradient_checkpointing: every_n_layers must be an int >= 1, got {every_n_layers!r}")
    if plan == "auto" and not isinstance(manager, Manager):
        raise TypeError(
            "enable_gradient_checkpointing: plan='auto' needs manager, a torch_offload.Manager with "
            f"device_target_bytes, got {type(manager).__name__}"
        )
    if not any(hasattr(module, "gradient_checkpointing") for module in model.modules()):
        raise ValueError(
            f"enable_gradient_checkpointing: no module of the {type(model).__name__} has a gradient_checkpointing "
            "attribute (the Hugging Face convention for a layer that can be checkpointed), so nothing would be "
            "checkpointed; for a stack of blocks use torch_offload.PlannedModuleList or call a PlannedCheckpoint "
            "or CheckpointOffload yourself"
        )
    _checked_checkpoint_kwargs("enable_gradient_checkpointing", checkpoint_kwargs)
    if plan == "auto":
        func = PlannedCheckpoint(manager, **checkpoint_kwargs)
    else:
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


# The same without offloading, for comparisons: HF's default
# (use_reentrant=False) gradient_checkpointing_func, whose hooks an
# exception from the layer leaves in order (_checkpoint).
plain_checkpoint = functools.partial(_checkpoint, use_reentrant=False)


# ------------------------------------------------------------ the automatic plan

_MEASURE_KEY = "torch_offload_measure"
_counting = threading.local()  # the block being measured on this thread: its saved storages
_planned = threading.local()  # planned blocks running on this thread (`depth`): an inner one just runs


def _measure_saved(x):
    """torch.utils.checkpoint's per-saved-tensor metadata function while a
    PlannedCheckpoint block is measured: counts the device storage it saves
    (once per storage, parameters excluded), then gives the default
    metadata (so the recomputation's check is the usual one)."""
    count = getattr(_counting, "storages", None)
    if count is not None and x.device.type != "cpu" and not _is_parameter_like(x):
        storage = x.untyped_storage()
        # A weak reference until the block returns: the storage's bytes are
        # freed as usual, but its object (the key) is not reused meanwhile.
        ref = StorageWeakRef(storage)
        if ref.cdata not in count:
            count[ref.cdata] = (ref, storage.nbytes())
    return torch.utils.checkpoint._default_meta_extractor(x)


def _is_parameter_like(t):
    base = t._base if t._base is not None else t
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


def _device_bytes(tensors):
    """Storage bytes of the tensors on an accelerator, each storage once."""
    seen = {}
    for t in tensors:
        if t.device.type != "cpu" and not _is_parameter_like(t):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _timed_ns(device, fn):
    """fn() and its time on `device`'s current stream, nanoseconds (device
    events where they time, else the wall clock between synchronizations)."""
    try:
        start = torch.Event(device=device, enable_timing=True)
        end = torch.Event(device=device, enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return out, int(start.elapsed_time(end) * 1e6)
    except RuntimeError:
        torch.accelerator.synchronize(device)
        begin = time.perf_counter_ns()
        out = fn()
        torch.accelerator.synchronize(device)
        return out, time.perf_counter_ns() - begin


def _probe_link(impl, t):
    """Times blocking copies of t's bytes (all, and a quarter) to pinned host
    memory, the best of two each, for the plan's link model."""
    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    n = flat.numel()
    if n // 4 == 0:
        return
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)

    def best(m):
        times = []
        for _ in range(2):
            torch.accelerator.synchronize(t.device)
            begin = time.perf_counter_ns()
            host[:m].copy_(flat[:m])
            times.append(time.perf_counter_ns() - begin)
        return min(times)

    impl.plan_link(n, best(n), n // 4, best(n // 4))


def _module_of(function):
    """The nn.Module `function` is, or whose method it is (through
    functools.partial: Hugging Face passes ``partial(forward, self,
    **kwargs)``, the class's forward with the layer bound as its first
    argument, and before 5.x ``partial(super().__call__, **kwargs)``);
    None otherwise."""
    while isinstance(function, functools.partial):
        first = function.args[0] if function.args else None
        inner = function.func
        if (
            isinstance(first, torch.nn.Module)
            and not isinstance(inner, (torch.nn.Module, functools.partial))
            and getattr(inner, "__self__", None) is None
        ):
            return first
        function = inner
    if isinstance(function, torch.nn.Module):
        return function
    owner = getattr(function, "__self__", None)
    return owner if isinstance(owner, torch.nn.Module) else None


def _state_of(function):
    """The state a block writes in place when it runs: its module's buffers
    that do not require grad (BatchNorm's running statistics)."""
    module = _module_of(function)
    if module is None:
        return []
    return [b for b in module.buffers() if b is not None and not b.requires_grad]


def _write(state, values):
    # Through .data: the same storage under a version counter of its own,
    # so a saved buffer stays usable for autograd's in-place check.
    with torch.no_grad():
        for tensor, value in zip(state, values, strict=True):
            tensor.data.copy_(value)


def _keyword_inputs_positional(function, args, kwargs):
    """A layer called with its input by keyword (``layer(hidden_states=h,
    attention_mask=m)``) reaches a Hugging Face ``gradient_checkpointing_func``
    as ``partial(forward, self, hidden_states=h, attention_mask=m)`` and no
    positional argument: the plan would see no input (nothing measured,
    and a recomputed layer's input never offloaded: the partial holds it).
    Where no positional argument is a tensor, the partial's floating-point
    keyword tensors that require grad (the activations flowing through the
    layers, not masks or tables) are passed positionally instead, to a
    function giving them back to the same function by name; checkpoint
    then saves them, and the plan counts them, as a positional input.
    A name also given at the call (``kwargs``, which overrides the
    partial's) is left as it is. Returns ``(function, args)``, unchanged
    otherwise."""
    if any(isinstance(a, torch.Tensor) for a in args) or not isinstance(function, functools.partial):
        return function, args
    names = [
        name
        for name, value in function.keywords.items()
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.requires_grad and name not in kwargs
    ]
    if not names:
        return function, args
    inner = functools.partial(
        function.func, *function.args, **{k: v for k, v in function.keywords.items() if k not in names}
    )
    given = len(args)

    def by_name(*values, **kwargs):
        return inner(*values[:given], **dict(zip(names, values[given:], strict=True)), **kwargs)

    return by_name, (*args, *(function.keywords[name] for name in names))


def _changed(before, after):
    """Per pair of tensors, whether they differ in shape, dtype or device,
    or in a value (NaN differs from itself, as in ``torch.equal``), with
    one device-to-host copy per device rather than one per pair. (Unlike
    ``torch.equal`` it neither promotes dtypes nor raises on two devices:
    `_restoring` compares a state with its own clone.)"""
    changed = [None] * len(before)
    flags = {}  # device: [(index, 0-d bool tensor on that device)]
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        if b.shape != a.shape or b.dtype != a.dtype or b.device != a.device:
            changed[i] = True
        else:
            flags.setdefault(a.device, []).append((i, torch.ne(b, a).any()))
    for pairs in flags.values():
        for (i, _), value in zip(pairs, torch.stack([f for _, f in pairs]).tolist(), strict=True):
            changed[i] = value
    return changed


def _restoring(function, state):
    """`function` whose later calls (checkpoint's recomputation) run with
    the values `state` held when the first call (the forward) began, and
    leave `state` as they found it (also when stopped by an exception).
    Only what the forward changed is held until then: a buffer it left as
    it found it (a causal mask, a frozen table) is copied during the
    forward alone."""
    if not state:
        return function
    at_forward = None  # per tensor of `state`: its value before the forward, or None: the forward left it

    def run(*args, **kwargs):
        nonlocal at_forward
        if at_forward is None:
            before = [t.detach().clone() for t in state]
            at_forward = before
            try:
                return function(*args, **kwargs)
            finally:
                at_forward = [b if c else None for b, c in zip(before, _changed(before, state), strict=True)]
        written = [(t, v) for t, v in zip(state, at_forward, strict=True) if v is not None]
        if not written:
            return function(*args, **kwargs)
        tensors = [t for t, _ in written]
        found = [t.detach().clone() for t in tensors]
        _write(tensors, [v for _, v in written])
        try:
            return function(*args, **kwargs)
        finally:
            _write(tensors, found)

    return run


class PlannedCheckpoint:
    """A ``gradient_checkpointing_func`` whose blocks the automatic plan of
    ``manager`` (one with ``device_target_bytes``) keeps, offloads or
    recomputes each step (docs/guide.md, "The automatic plan"), as
    ``offload::checkpoint`` with ``CheckpointOptions::planned`` does in C++.

    Open ``with manager:`` around each step's whole forward (the step the
    plan counts blocks in); Hugging Face models call this for every layer
    (``enable_gradient_checkpointing(model, manager, plan="auto")`` installs
    it), and ``PlannedModuleList`` wraps an ``nn.ModuleList`` of blocks.
    Per block: **keep** runs it under ``no_offload()``; **offload** runs it
    as is (its saved tensors go through the manager); **recompute** runs
    ``torch.utils.checkpoint.checkpoint(function, *args,
    use_reentrant=False)``, whose saved inputs go through the manager (or,
    where the plan keeps them, under ``no_offload()``). In a
    measuring step (the first, and the one after input sizes change) every
    block is recomputed, timed with device events and what it saves is
    counted (through checkpoint's ``determinism_check`` metadata hook, the
    only place PyTorch shows a checkpointed block's saved tensors), and
    the device's allocated bytes are recorded where its recomputation
    begins in backward; the link is timed with two copies of a block's input. Gradients are bitwise
    those without checkpointing in every case. Outside ``with manager:`` on
    this thread (or where a ``no_offload()`` or other saved-tensor hooks
    region is open inside it), with grad mode off, or inside another
    planned block, the function just runs and the plan does not count it.
    A block that updates state in forward (BatchNorm's running statistics)
    is not changed twice where it is recomputed: when the function is an
    ``nn.Module``, a (``functools.partial`` of a) method of one, or
    ``partial(forward, module, ...)`` (what Hugging Face layers pass), the
    module's buffers are copied when its forward begins; the recomputation runs with those values written back
    and the values it found are written back after it, as the C++
    ``CheckpointOptions::state`` does (law 7 of docs/checkpoint.md), so
    evaluation after training is bitwise the run without checkpointing.
    Neither write counts as an in-place change for autograd's check. A
    block whose input came by keyword (``layer(hidden_states=h)`` reaches
    here as ``partial(forward, self, hidden_states=h)``) gets it
    positionally (the partial's floating-point keyword tensors that
    require grad), so the plan measures and offloads it as a positional
    input.

    Args:
        manager: a torch_offload.Manager with ``device_target_bytes > 0``.
        **checkpoint_kwargs: passed to ``torch.utils.checkpoint.checkpoint``
            (``preserve_rng_state``, ...); ``use_reentrant`` must be False.

    Raises:
        TypeError: ``manager`` is not a torch_offload.Manager, or a keyword
            argument is not one of checkpoint's own.
        ValueError: its ``device_target_bytes`` is 0, or ``use_reentrant=True`` (here or at a call).
    """

    def __init__(self, manager, **checkpoint_kwargs):
        if not isinstance(manager, Manager):
            raise TypeError(f"PlannedCheckpoint: manager must be a torch_offload.Manager, got {type(manager).__name__}")
        if manager.options["device_target_bytes"] <= 0:
            raise ValueError(
                "PlannedCheckpoint: the manager's device_target_bytes must be > 0 (the plan meets that target), got 0"
            )
        _checked_checkpoint_kwargs("PlannedCheckpoint", checkpoint_kwargs)
        self._kwargs = {**_call_kwargs("PlannedCheckpoint", {}, checkpoint_kwargs), "use_reentrant": False}
        self.manager = manager
        torch.utils.checkpoint._allowed_determinism_checks_to_fns.setdefault(_MEASURE_KEY, _measure_saved)

    def __call__(self, function, *args, **kwargs):
        _call_kwargs("PlannedCheckpoint", self._kwargs, kwargs)  # use_reentrant=True raises before anything runs
        if not torch.is_grad_enabled() or not self.manager._open_here() or getattr(_planned, "depth", 0):
            return function(*args, **_function_kwargs(kwargs))
        _planned.depth = 1
        try:
            return self._run(function, args, kwargs)
        finally:
            _planned.depth = 0

    def _run(self, function, args, kwargs):
        state = _state_of(function)
        function, args = _keyword_inputs_positional(function, args, kwargs)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        impl = self.manager._impl
        index = next((t.device.index for t in tensors if t.device.type != "cpu"), None)
        turn = impl.plan_block(_device_bytes(tensors), -1 if index is None else index)
        if turn is None:
            return function(*args, **_function_kwargs(kwargs))
        try:
            return self._turn(turn, tensors, function, args, kwargs, state)
        finally:
            impl.plan_block_done()

    def _turn(self, turn, tensors, function, args, kwargs, state):
        index, choice, measure, probe = turn
        if choice != "keep" and choice != "offload":
            function = _restoring(function, state)
        if choice == "keep":
            with no_offload():
                return function(*args, **_function_kwargs(kwargs))
        if choice == "offload":
            return function(*args, **_function_kwargs(kwargs))
        run_kwargs = {**self._kwargs, **kwargs}
        if choice == "recompute_input_kept":
            with no_offload():  # checkpoint saves the inputs here; its own hooks record the rest
                return _checkpoint(function, *args, **run_kwargs)
        if not measure:
            return _checkpoint(function, *args, **run_kwargs)
        return self._measured(index, probe, tensors, function, args, kwargs)

    def _measured(self, index, probe, tensors, function, args, kwargs):
        on_device = [t for t in tensors if t.device.type != "cpu"]
        device = on_device[0].device if on_device else None
        # The measuring step's own determinism check counts what the block
        # saves (it also runs the default check).
        run_kwargs = {**self._kwargs, **kwargs, "determinism_check": _MEASURE_KEY}
        impl = self.manager._impl
        calls = 0

        def block(*a, **k):
            # The second call is the recomputation in backward: the plan
            # records the device's allocated bytes where it begins, and its
            # time (checkpoint may stop it early with an exception).
            nonlocal calls
            calls += 1
            if calls != 2 or device is None:
                return function(*a, **k)
            impl.plan_recomputing(index, device.index if device.index is not None else 0)
            torch.accelerator.synchronize(device)
            begin = time.perf_counter_ns()
            try:
                return function(*a, **k)
            finally:
                torch.accelerator.synchronize(device)
                impl.plan_recomputed(index, time.perf_counter_ns() - begin)

        _counting.storages = {}
        try:

            def run():
                return _checkpoint(block, *args, **run_kwargs)

            if device is None:
                begin = time.perf_counter_ns()
                out = run()
                ns = time.perf_counter_ns() - begin
            else:
                out, ns = _timed_ns(device, run)
            storages = _counting.storages
        finally:
            _counting.storages = None
        sizes = [nbytes for _, nbytes in storages.values()]
        impl.plan_measured(index, ns, sum(sizes), len(sizes), _device_bytes(tensors), max(sizes, default=0))
        if probe and on_device:
            _probe_link(impl, on_device[0])
        return out

    def summary(self):
        """What the plan was made from and chose, one line per block."""
        return self.manager._impl.plan_summary()

    def __repr__(self):
        return f"PlannedCheckpoint({self.manager!r})"


# Per thread: the PlannedModuleLists (ids) whose forward is running.
_running_lists = threading.local()


class _OutsideHook:
    """A block's forward pre-hook calling its PlannedModuleList's
    _outside_forward, through a weak reference: a strong one would make a
    cycle (list -> block -> hook -> list) that keeps a dropped model's
    device memory until the garbage collector runs. Pickled and copied with
    its list."""

    __slots__ = ("owner",)

    def __init__(self, owner):
        self.owner = weakref.ref(owner)

    def __call__(self, block, args):
        owner = self.owner()
        if owner is not None:
            owner._outside_forward(block, args)

    def __reduce__(self):
        return (_OutsideHook, (self.owner(),))


def _load_nested_blocks(state_dict, prefix, *args):
    """Loads a state_dict whose blocks sit under ``blocks.N...`` below the
    list's prefix (as a list nested in a ``.blocks`` module saves them)."""
    nested = prefix + "blocks."
    for key in [k for k in state_dict if k.startswith(nested) and k[len(nested) :].split(".")[0].isdigit()]:
        state_dict[prefix + key[len(nested) :]] = state_dict.pop(key)


class PlannedModuleList(torch.nn.ModuleList):
    """An ``nn.ModuleList`` of blocks that runs them in order (``x =
    block(x)``), each through a PlannedCheckpoint of ``manager``: the
    automatic plan for a model that is a stack of blocks. It is the list
    of its blocks (iteration, indexing, ``len``, ``append``, ``extend``,
    ``insert``), registered as ``nn.ModuleList`` registers them, so
    ``model.layers = PlannedModuleList(model.layers, manager)`` keeps the
    model's ``state_dict`` keys (``layers.N...``): checkpoints load with it
    and without it. The plan runs where the list itself is called
    (``h = self.layers(h)``); a block called on its own (a forward that
    iterates or indexes the list) runs without it, and the first such call
    under ``with manager:`` warns (an OffloadWarning, once per list). A
    slice is a plain ``nn.ModuleList``. ``.planned`` is the
    PlannedCheckpoint."""

    def __init__(self, blocks, manager, **checkpoint_kwargs):
        _checked_checkpoint_kwargs("PlannedModuleList", checkpoint_kwargs)
        planned = PlannedCheckpoint(manager, **checkpoint_kwargs)  # checks the manager first
        try:
            modules = list(blocks)
            if not all(isinstance(b, torch.nn.Module) for b in modules):
                raise TypeError
        except TypeError:
            single = (
                " (pass its .values(), in the order they run)"
                if isinstance(blocks, torch.nn.ModuleDict)
                else " (a single module: wrap it in a list)"
                if isinstance(blocks, torch.nn.Module)
                else ""
            )
            raise TypeError(
                "PlannedModuleList: blocks must be an nn.ModuleList or an iterable of modules (an nn.Sequential: "
                f"its children), got {type(blocks).__name__}{single}"
            ) from None
        super().__init__(modules)  # add_module hooks each block
        self.planned = planned  # not a module: never in the list or its state_dict
        self._warned_outside = False
        self._register_load_state_dict_pre_hook(_load_nested_blocks)

    def add_module(self, name, module):
        super().add_module(name, module)
        self._watch_block(module)

    def insert(self, index, module):
        super().insert(index, module)
        self._watch_block(module)

    def _watch_block(self, block):
        """A forward pre-hook on `block` (once) for _outside_forward."""
        hooks = block._forward_pre_hooks.values()
        if not any(isinstance(h, _OutsideHook) and h.owner() is self for h in hooks):
            block.register_forward_pre_hook(_OutsideHook(self))

    def _outside_forward(self, block, args):
        """Warns once where a block runs forward under the manager's scope
        outside this list's forward (the model's forward iterates the list):
        it runs without the plan."""
        if self._warned_outside or not _report.forward_saves_here():
            return
        if id(self) in getattr(_running_lists, "ids", ()) or not self.planned.manager._open_here():
            return  # in this list's forward, or not under the manager's scope
        self._warned_outside = True
        warnings.warn(
            f"torch_offload.PlannedModuleList: a block ({type(block).__name__}) ran forward outside the list's own "
            "forward (does the model's forward iterate or index the list?): it ran without the plan. Call the "
            "list itself, h = self.layers(h, ...) (warned once per list)",
            OffloadWarning,
            stacklevel=_C.user_stacklevel(),
        )

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return torch.nn.ModuleList(list(self._modules.values())[idx])
        return super().__getitem__(idx)

    @property
    def blocks(self):
        """The list itself (code that reads ``.blocks`` gets the blocks)."""
        return self

    def forward(self, x, *args, **kwargs):
        # Keyword arguments are the blocks' (bound here), never checkpoint's
        # options (``debug``, ``determinism_check``: PlannedModuleList's own).
        ids = getattr(_running_lists, "ids", None)
        if ids is None:
            ids = _running_lists.ids = set()
        ids.add(id(self))
        try:
            for block in self:
                x = self.planned(functools.partial(block, **kwargs) if kwargs else block, x, *args)
        finally:
            ids.discard(id(self))
        return x

    def summary(self):
        """What the plan was made from and chose, one line per block (a str;
        PlannedCheckpoint.summary)."""
        return self.planned.summary()
