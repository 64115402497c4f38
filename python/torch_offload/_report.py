# SPDX-License-Identifier: MIT
"""What a step offloaded and kept, per module (Manager.watch, Manager.report),
and the warning for modules run on a thread where no scope is open."""

import dataclasses
import threading
import warnings
import weakref

import torch

from . import _C

OffloadWarning = _C.OffloadWarning

# The reasons a saved tensor stays (the passed_* counters, as Stats lists
# them), each with the words a report prints; a reason without words here
# prints its field's name.
_WORDS = {
    "passed_leaf": "parameter",
    "passed_small": "small (min_offload_bytes)",
    "passed_target": "target (device_target_bytes)",
    "passed_budget": "host budget (host_budget_bytes)",
}
REASONS = tuple(
    (name, _WORDS.get(name, name.removeprefix("passed_").replace("_", " "))) for name in _C.passed_through_fields()
)
_COUNTED = ("tensors_seen", "tensors_offloaded", "bytes_offloaded", "bytes_kept") + tuple(n for n, _ in REASONS)
OUTSIDE = "(outside watched modules)"


@dataclasses.dataclass
class ModuleRow:
    """One module's saved tensors in a step (its own, not its children's):
    how many were seen and offloaded, the bytes offloaded (each storage
    once) and kept on the device (each strided tensor's own bytes), and how
    many stayed for each reason (``reasons``: words -> count, only the
    nonzero ones)."""

    module: str
    tensors_seen: int = 0
    tensors_offloaded: int = 0
    bytes_offloaded: int = 0
    bytes_kept: int = 0
    reasons: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Report:
    """What the last step (from the last outermost ``with manager:`` on)
    saved through the manager, per watched module; ``str()`` is a table."""

    rows: list

    def __str__(self):
        if not self.rows:
            return "torch_offload report: nothing saved through the manager since its last outermost `with`"
        head = ("module", "saved", "offloaded", "bytes offloaded", "bytes kept", "kept because")
        lines = [head] + [
            (
                r.module,
                str(r.tensors_seen),
                str(r.tensors_offloaded),
                str(r.bytes_offloaded),
                str(r.bytes_kept),
                ", ".join(f"{why} {n}" for why, n in r.reasons.items()),
            )
            for r in self.rows
        ]
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]

        def row(line):
            cells = zip(line, widths, strict=True)
            return "  ".join(c.ljust(w) if i in (0, 5) else c.rjust(w) for i, (c, w) in enumerate(cells)).rstrip()

        return "\n".join(row(line) for line in lines)


class _Hook:
    """A watched module's forward hook (pre or post): calls `fn`. Pickled
    (``torch.save`` of a watched model) as a hook that does nothing: the
    accounting belongs to the manager of this process."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)

    def __reduce__(self):
        return (_Hook, (_nothing,))


def _nothing(*args):
    return None


class Watch:
    """Per-module accounting for one manager: forward pre- and post-hooks on
    each watched module take the manager's counters; what changed between
    them, less what the module's children took, is the module's. Counted on
    threads where the manager's scope is open; the step is reset when the
    manager's first scope opens (no other thread's open)."""

    def __init__(self, impl):
        self._impl = impl
        self._lock = threading.Lock()
        self._local = threading.local()
        self._rows = {}
        self._start = None  # the manager's counters when the step began
        self._handles = []
        self._watched = weakref.WeakSet()

    def watch(self, model, is_open, name):
        for path, module in model.named_modules():
            if module in self._watched:
                continue
            self._watched.add(module)
            label = ".".join(p for p in (name, path) if p) or type(module).__name__
            self._handles.append(module.register_forward_pre_hook(_Hook(self._pre_hook(is_open))))
            self._handles.append(module.register_forward_hook(_Hook(self._post_hook(label)), always_call=True))

    def _counts(self):
        stats = dict(self._impl.stats())
        return {k: stats[k] for k in _COUNTED}

    def _pre_hook(self, is_open):
        def pre(module, args):
            if torch.compiler.is_compiling():
                return  # inside a compiled region: its module calls are not accounted
            stack = getattr(self._local, "stack", None)
            if stack is None:
                stack = self._local.stack = []
            # (counts at entry, what the children took) or None where the
            # scope is not open here: the module's saved tensors do not go
            # through this manager.
            stack.append([self._counts(), dict.fromkeys(_COUNTED, 0)] if is_open() else None)

        return pre

    def _post_hook(self, label):
        def post(module, args, output):
            if torch.compiler.is_compiling():
                return
            stack = getattr(self._local, "stack", None)
            if not stack:
                return
            entry = stack.pop()
            if entry is None:
                return
            before, children = entry
            now = self._counts()
            took = {k: now[k] - before[k] for k in _COUNTED}
            own = {k: took[k] - children[k] for k in _COUNTED}
            for parent in reversed(stack):
                if parent is not None:
                    for k in _COUNTED:
                        parent[1][k] += took[k]
                    break
            self._add(label, own)

        return post

    def _add(self, label, counts):
        if not any(counts.values()):
            return
        with self._lock:
            row = self._rows.setdefault(label, dict.fromkeys(_COUNTED, 0))
            for k in _COUNTED:
                row[k] += counts[k]

    def begin_step(self):
        """At the manager's first scope: a new step, from its counters now."""
        start = self._counts()
        with self._lock:
            self._rows = {}
            self._start = start

    def report(self):
        with self._lock:
            rows = {label: dict(row) for label, row in self._rows.items()}
            start = self._start
        if start is not None:  # what no watched module took
            now = self._counts()
            outside = {k: now[k] - start.get(k, 0) - sum(r[k] for r in rows.values()) for k in _COUNTED}
            if any(v > 0 for v in outside.values()):
                rows[OUTSIDE] = outside
        return Report(
            [
                ModuleRow(
                    module=label,
                    tensors_seen=row["tensors_seen"],
                    tensors_offloaded=row["tensors_offloaded"],
                    bytes_offloaded=row["bytes_offloaded"],
                    bytes_kept=row["bytes_kept"],
                    reasons={why: row[name] for name, why in REASONS if row[name] > 0},
                )
                for label, row in rows.items()
            ]
        )

    def remove(self):
        """Removes every hook watch() registered."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._watched = weakref.WeakSet()
        with self._lock:
            self._rows = {}


# Modules run on a thread without saved-tensor hooks while a manager's
# scope is open on another thread: their saved tensors are not offloaded
# (hooks are per thread). A process-wide forward pre-hook, registered at
# the first scope and kept (adding and removing it each step would change
# what torch.compile guards on), warns once per manager; with no scope open
# it returns at once.
_open_lock = threading.Lock()
_open = {}  # manager -> {thread id: open scopes}
_hook = None


def forward_saves_here():
    """Whether a module's forward starting on this thread now saves tensors
    for backward as a forward of its own: grad enabled, not a recomputation
    inside backward, not traced by torch.compile (a constant there, so the
    hooks that ask add nothing to the graph)."""
    return not torch.compiler.is_compiling() and torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1


def _other_thread_hook(module, args):
    if not _open or not forward_saves_here():
        return  # no scope open, or nothing saved by a forward of its own
    me = threading.get_ident()
    if torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
        return  # this thread's saved tensors go through hooks (a scope, no_offload, another tool)
    with _open_lock:
        managers = [m for m, threads in _open.items() if threads and me not in threads and not m._warned_thread]
        for m in managers:
            m._warned_thread = True
    for m in managers:
        warnings.warn(
            f"torch_offload.{type(m).__name__}: a module ({type(module).__name__}) ran forward with grad on a "
            "thread where no `with manager:` is open, while one is open on another thread: saved-tensor hooks are "
            "per thread, so nothing it saves is offloaded. Open the scope on the thread that runs the forward "
            "(warned once per manager)",
            OffloadWarning,
            stacklevel=_C.user_stacklevel(),
        )


def scope_opened(manager):
    """A scope of `manager` opened on this thread; True when it is the
    manager's only one open (no other scope of it, on any thread)."""
    global _hook
    me = threading.get_ident()
    with _open_lock:
        first = manager not in _open
        threads = _open.setdefault(manager, {})
        threads[me] = threads.get(me, 0) + 1
        if _hook is None:
            _hook = torch.nn.modules.module.register_module_forward_pre_hook(_other_thread_hook)
    return first


def scope_closed(manager):
    me = threading.get_ident()
    with _open_lock:
        threads = _open.get(manager, {})
        if threads.get(me, 0) > 1:
            threads[me] -= 1
        else:
            threads.pop(me, None)
        if not threads:
            _open.pop(manager, None)
