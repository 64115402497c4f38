# SPDX-License-Identifier: MIT
"""The simulated accelerator (offload::sim) inside a Python process.

    import torch_offload.sim
    torch_offload.sim.install(copy_latency_us=300, poison_freed=True)
    x = torch.randn(4, device="sim")
    torch.get_device_module("sim").max_memory_allocated()

``install`` registers the PrivateUse1 backend under ``name`` for the whole
process (device memory from a counting allocator, one worker thread per
stream, events, asynchronous copies, a link that makes every CPU<->device
copy take latency + bytes / bandwidth, poisoning of freed memory),
generates the ``Tensor.<name>()`` methods, and registers a device module,
so that ``torch.get_device_module(name)`` and ``torch.<name>`` give
device-generic code what it calls: is_available,
device_count, current_device, set_device, synchronize, current_stream,
stream(s), Stream, Event, empty_cache, memory_allocated,
max_memory_allocated, reset_peak_memory_stats, manual_seed(_all).
Importing this module loads the sim library (it registers a PrivateUse1
device guard), so import it only where the simulated device is wanted.
"""

import atexit
import contextlib
import ctypes
import os
import sys
import types

import torch

import torch_offload  # noqa: F401  (the torch version check)

from . import _C

# _sim registers itself with the core that _C holds (offload::detail::note_linked,
# so make_manager's messages know sim is there). Python loads extension modules
# with RTLD_LOCAL: make _C's symbols visible to the modules loaded after it.
ctypes.CDLL(_C.__file__, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)

from . import _sim  # noqa: E402

__all__ = [
    "install",
    "installed",
    "config",
    "set_copy_latency_us",
    "set_copy_bandwidth_gbps",
    "set_poison_freed",
    "set_capacity_bytes",
    "set_host_power_of_two",
    "set_pinned_alloc_us",
    "set_check_streams",
    "device_memory",
    "reset_peak",
    "host_memory",
    "reset_host_peak",
    "empty_cache",
    "synchronize",
    "device_module",
    "collective_backend",
]


def install(
    name="sim",
    num_devices=2,
    capacity_bytes=0,
    copy_latency_us=10,
    copy_bandwidth_gbps=25.0,
    poison_freed=False,
    host_power_of_two=False,
    pinned_alloc_us=0,
    check_streams=False,
):
    """Registers the simulated accelerator for this process (see the module doc).

    Args:
        name: the PrivateUse1 backend name (lower-case letters, digits, '_',
            starting with a letter, at most 32 characters, not an in-tree
            device type).
        num_devices: [1, 16].
        capacity_bytes: device memory per device, 0 = unlimited; an
            allocation beyond it raises torch.OutOfMemoryError.
        copy_latency_us: link latency: every CPU<->sim copy, blocking or
            not, takes this long plus its bytes over the bandwidth, on the
            stream it runs on (a blocking one makes the host wait),
            [0, 10_000_000] microseconds. The default (10) is the order of
            a PCIe DMA transfer's fixed cost.
        copy_bandwidth_gbps: link bandwidth, (0, 10_000] GB/s (1e9 bytes a
            second). The default (25) is a pinned copy over PCIe 4.0 x16.
        poison_freed: fill device blocks with 0xFF (NaN) when allocated and
            when released.
        host_power_of_two: the pinned host allocator rounds a block it
            takes from malloc up to a power of two, as PyTorch's caching
            host allocator (CUDA's) does; False: 512 bytes below 1 MiB,
            128 KiB above.
        pinned_alloc_us: what a fresh pinned host block costs the thread
            that allocates it (a block reused from the cache costs
            nothing), [0, 1_000_000] microseconds: cudaHostAlloc pins pages
            and costs milliseconds. With host_power_of_two=True, sim's
            pinned memory behaves as CUDA's (docs/guide.md).
        check_streams: stream-order checking, as torch.cuda._sanitizer
            checks CUDA streams: an access to a storage not ordered after
            the last conflicting access from another stream (by an event
            wait or a synchronize), a device block reused after an
            unrecorded stream used it, or a pinned buffer reused before its
            copy is ordered, raises RuntimeError from the operator
            (docs/testing.md). OFFLOAD_SIM_CHECK_STREAMS=0 or 1, read at the
            first install, overrides it.

    Raises ValueError for a field out of range (naming it) or an
    OFFLOAD_SIM_CHECK_STREAMS other than 0 or 1, RuntimeError
    when already installed with a different configuration (naming each
    differing field) or when another PrivateUse1 backend is registered.
    Installing the same configuration again does nothing. Thread-safe.

    Install it before the first backward pass of the process: PyTorch's
    autograd engine sizes its per-device queues at that pass, so a device
    registered later can never run backward. Where a backward pass ran
    before this module was imported, install raises RuntimeError saying
    so, before anything changes (a fresh process is the remedy).
    """
    first = not _sim.installed()
    _sim.install(
        name,
        num_devices,
        capacity_bytes,
        copy_latency_us,
        copy_bandwidth_gbps,
        bool(poison_freed),
        bool(host_power_of_two),
        pinned_alloc_us,
        bool(check_streams),
    )
    if first or not hasattr(torch, name):
        torch.utils.rename_privateuse1_backend(name)
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
        torch._register_device_module(name, device_module)
        atexit.register(_drain_at_exit)
    _register_collectives(name)


def _drain_at_exit():
    """Runs the work still queued on every sim stream while the interpreter
    is alive, and from then on every stream's work on the thread that queues
    it (offload::sim::drain_for_exit). A worker that finishes a task drops
    what it captured, and a tensor with a Python object needs the GIL for
    that, which a thread outside the interpreter cannot take once it is
    finalizing (Python ends such a thread, and the C++ runtime aborts the
    process). The wait releases the GIL."""
    _sim.drain_for_exit()


installed = _sim.installed

#: The torch.distributed backend that install() registers for the sim device
#: (see docs/distributed.md): init_process_group("cpu:gloo,sim:offload_sim"),
#: or init_process_group() with no backend.
collective_backend = _sim.collective_backend_name


def _register_collectives(device_name):
    import torch.distributed as dist

    if not dist.is_available() or collective_backend in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        collective_backend, _sim.make_collective_backend, extended_api=False, devices=[device_name]
    )


def config():
    """The installed configuration (dict), with the runtime knobs' current values."""
    return _sim.config()


def set_copy_latency_us(us):
    """Link latency of copies issued from now on, [0, 10_000_000] microseconds."""
    _sim.set_copy_latency_us(us)


def set_copy_bandwidth_gbps(gbps):
    """Link bandwidth of copies issued from now on, (0, 10_000] GB/s."""
    _sim.set_copy_bandwidth_gbps(gbps)


def set_poison_freed(on):
    """Checking mode for blocks allocated or released from now on."""
    _sim.set_poison_freed(bool(on))


def set_capacity_bytes(nbytes):
    """Per-device capacity in bytes, 0 = unlimited."""
    _sim.set_capacity_bytes(nbytes)


def set_host_power_of_two(on):
    """Power-of-two rounding of pinned host blocks taken from malloc from now on."""
    _sim.set_host_power_of_two(bool(on))


def set_pinned_alloc_us(us):
    """Cost of a fresh pinned host block from now on, [0, 1_000_000] microseconds."""
    _sim.set_pinned_alloc_us(us)


def set_check_streams(on):
    """Stream-order checking (install()'s check_streams) from now on; turning
    it on starts from a clean slate, so set it while no work is in flight."""
    _sim.set_check_streams(bool(on))


def device_memory(index=0):
    """Counters of device ``index``: dict of current_bytes, peak_bytes,
    allocations, frees (bytes as requested; a block counts until its
    stream-ordered release), reserved_bytes and peak_reserved_bytes (taken
    from malloc: blocks in use at their rounded sizes, idle in the cache or
    in the poison quarantine) and system_allocations (blocks taken from
    malloc, not the cache)."""
    return _sim.device_memory(index)


def reset_peak(index=0):
    """Sets the peak of device ``index`` to its current bytes."""
    _sim.reset_peak(index)


def host_memory():
    """Counters of the pinned host allocator (same keys as device_memory;
    system_allocations: fresh pinned blocks, what cudaHostAlloc calls are on
    CUDA)."""
    return _sim.host_memory()


def reset_host_peak():
    """Sets the host peak to the current host bytes."""
    _sim.reset_host_peak()


def empty_cache():
    """Returns the idle cached blocks of every sim device and of the pinned
    host allocator to malloc (offload::sim::empty_cache); blocks in use,
    waiting for stream work or in the poison quarantine stay. The device
    module's empty_cache (torch.sim.empty_cache()) only synchronizes."""
    _sim.empty_cache()


def synchronize(device=None):
    """Waits for every stream of the device (default: the current one)."""
    _sim.synchronize(_index(device))


# ---------------------------------------------------------------- device module


def _index(device):
    if device is None:
        return _sim.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return _sim.current_device() if device.index is None else device.index


def _name():
    return _sim.config()["name"]


def current_stream(device=None):
    """The calling thread's current stream on ``device`` (a torch.Stream)."""
    index = _index(device)
    return torch.Stream(stream_id=_sim.current_stream_id(index), device_index=index, device_type=_sim.device_type)


@contextlib.contextmanager
def stream(s):
    """Makes ``s`` (a torch.Stream of this device, or None) the calling
    thread's current stream on its device for the block."""
    if s is None:
        yield
        return
    previous = _sim.exchange_stream(s.stream_id, s.device_index)
    try:
        yield
    finally:
        _sim.exchange_stream(previous, s.device_index)


@contextlib.contextmanager
def device(device):
    """Makes ``device`` (an index, or a sim ``torch.device`` or its name)
    the current sim device for the block, as ``torch.cuda.device``; None
    or a negative index changes nothing. What ``torch.load`` of sim tensors
    and ``Storage.to`` enter."""
    index = None if device is None else _index(device)
    if index is None or index < 0:
        yield
        return
    previous = _sim.current_device()
    _sim.set_device(index)
    try:
        yield
    finally:
        _sim.set_device(previous)


def Stream(device=None, priority=0):  # noqa: N802 (a class-like factory, as torch.cuda.Stream)
    """A stream from the device's pool (torch.Stream)."""
    return torch.Stream(device=torch.device(_name(), _index(device)), priority=priority)


def Event(enable_timing=False, blocking=False, interprocess=False):  # noqa: N802
    """An event of this device (torch.Event); recorded with ``stream.record_event()`` or ``event.record(stream)``."""
    return torch.Event(
        device=torch.device(_name(), _sim.current_device()),
        enable_timing=enable_timing,
        blocking=blocking,
        interprocess=interprocess,
    )


def _empty_cache():
    """Synchronizes every device; the cached blocks stay (torch_offload.sim.empty_cache() returns them)."""
    for i in range(_sim.config()["num_devices"]):
        _sim.synchronize(i)


def _memory_allocated(device=None):
    return _sim.device_memory(_index(device))["current_bytes"]


def _max_memory_allocated(device=None):
    return _sim.device_memory(_index(device))["peak_bytes"]


def _reset_peak_memory_stats(device=None):
    _sim.reset_peak(_index(device))


def _manual_seed(seed):
    # sim's random operators use the CPU generator (shared by all sim
    # devices); torch.manual_seed calls this too, so seed only that one.
    torch.default_generator.manual_seed(int(seed))


device_module = types.ModuleType("torch_offload.sim.device_module", "The device module registered for sim.")
for _fn_name, _fn in {
    "is_available": lambda: _sim.installed(),
    "device_count": lambda: _sim.config()["num_devices"] if _sim.installed() else 0,
    "current_device": lambda: _sim.current_device(),
    "set_device": lambda device: _sim.set_device(_index(device)),
    "synchronize": synchronize,
    "current_stream": current_stream,
    "default_stream": lambda device=None: torch.Stream(
        stream_id=0, device_index=_index(device), device_type=_sim.device_type
    ),
    "stream": stream,
    "device": device,
    "Stream": Stream,
    "Event": Event,
    "empty_cache": _empty_cache,
    "memory_allocated": _memory_allocated,
    "max_memory_allocated": _max_memory_allocated,
    "reset_peak_memory_stats": _reset_peak_memory_stats,
    "manual_seed": _manual_seed,
    "manual_seed_all": _manual_seed,
    "is_initialized": lambda: _sim.installed(),
    # Autocast runs sim ops with the CPU kernels; checkpoint saves and
    # restores the device RNG, which is the CPU generator.
    "get_amp_supported_dtype": lambda: [torch.float16, torch.bfloat16],
    "get_rng_state": lambda device=None: torch.get_rng_state(),
    "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
    "_is_in_bad_fork": lambda: False,
}.items():
    setattr(device_module, _fn_name, _fn)
sys.modules[device_module.__name__] = device_module
