# SPDX-License-Identifier: MIT
"""The pack rule from Python (docs/guide.md, "What is never offloaded"), on
the test device: parameters by identity (nn.Parameter, frozen too, and
views of one), everything else an activation (a custom Function's
intermediate, a frozen layer's output, the model input); tensor subclasses
offloaded through their inner tensors (TwoTensor, DTensor) or passed
through with one OffloadWarning per type; a subclass whose flatten round
trip fails; exclude(module) and exclude_types; warnings as OffloadWarning.
Each parity case is bitwise against the same run without the manager and
asserts what was offloaded."""

import contextlib
import warnings

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import cases
import torch_offload
import torch_offload.sim
from test_torch_offload import assert_bitwise, bits
from testdevice import DEV

SYNCS = ["blocking", "streamed"]


def run(manager, forward, params):
    """Loss and gradients of `params` for forward() inside `manager` (None: plain)."""
    with manager if manager is not None else contextlib.nullcontext():
        loss = forward()
    grads = torch.autograd.grad(loss, params)
    return [loss.detach(), *grads]


class Scale(torch.autograd.Function):
    """A fused op: saves an intermediate it computed (with grad mode off, so a leaf)."""

    @staticmethod
    def forward(ctx, x):
        stat = x.square().mean(dim=-1, keepdim=True).add(1.0).rsqrt()
        ctx.save_for_backward(x, stat)
        return x * stat

    @staticmethod
    def backward(ctx, grad):
        x, stat = ctx.saved_tensors
        return grad * stat - x * (grad * x).mean(dim=-1, keepdim=True) * stat.pow(3)


@pytest.mark.parametrize("sync", SYNCS)
def test_custom_function_intermediate_and_frozen_layer_output_are_offloaded(sync):
    torch.manual_seed(0)
    frozen = torch.nn.Linear(64, 64).to(DEV).requires_grad_(False)
    trained = torch.nn.Linear(64, 64).to(DEV)
    x = torch.randn(16, 64, device=DEV)  # the model input: a leaf without grad

    def forward():
        h = frozen(x)  # a frozen layer's output: a leaf without grad, saved by `trained`
        return Scale.apply(trained(h)).square().sum()

    params = list(trained.parameters())
    ref = run(None, forward, params)
    manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=0)
    assert_bitwise(ref, run(manager, forward, params))
    s = manager.stats()
    # Nothing needs a gradient for h, so trained saves h alone (not weight.t()), and frozen
    # saves nothing. Offloaded: h, Scale's x and stat, square's input; before the
    # rule knew parameters by identity, all four stayed as "leaves".
    assert s.tensors_seen == 4 and s.passed_through == 0
    assert s.tensors_offloaded == 4
    assert s.bytes_offloaded == 3 * 16 * 64 * 4 + 16 * 4


@pytest.mark.parametrize("sync", SYNCS)
def test_parameters_by_identity_frozen_and_views(sync):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64)).to(DEV)
    model[2].requires_grad_(False)
    x = torch.randn(8, 64, device=DEV, requires_grad=True)

    def forward():
        # model[2].weight (frozen) saved itself and as weight.t(); a detached copy is not a parameter.
        h = model(x)
        return (h * model[2].weight[:8, :]).sum() + (h * model[0].weight.detach()[:8, :] * 1).sum()

    params = [x, *model[0].parameters()]
    ref = run(None, forward, params)
    manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=0)
    assert_bitwise(ref, run(manager, forward, params))
    s = manager.stats()
    # Parameters: x (a leaf that requires grad), model[0].weight.t(), model[2].weight.t(),
    # model[2].weight[:8] (a view of a frozen nn.Parameter). Offloaded: tanh's output and
    # the detached weight's slice (a view of a tensor computed without grad, not a parameter).
    assert s.tensors_seen == 6 and s.passed_leaf == 4
    assert s.tensors_offloaded == 2


@pytest.mark.parametrize("sync", SYNCS)
def test_two_tensor_is_offloaded_through_its_inner_tensors_and_comes_back_the_same(sync):
    torch.manual_seed(0)
    a = torch.randn(32, 32, device=DEV)
    b = torch.randn(32, 32, device=DEV)
    w = torch.randn(32, 32, device=DEV, requires_grad=True)

    def forward():
        t = TwoTensor(a, b) * w  # a TwoTensor activation
        return t.sin().sum()

    def saved(manager):
        with manager if manager is not None else contextlib.nullcontext():
            t = TwoTensor(a, b) * w
            out = t.sin()
        return out.grad_fn._saved_self  # unpacks: what sin saved

    ref = run(None, forward, [w])
    manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=0)
    got = run(manager, forward, [w])
    assert_bitwise([ref[0].a, ref[0].b, ref[1]], [got[0].a, got[0].b, got[1]])
    assert isinstance(got[0], TwoTensor)
    s = manager.stats()
    assert s.tensors_offloaded >= 2 and s.passed_subclass == 0  # sin's input: its a and b

    back = saved(torch_offload.Manager(DEV, sync=sync, min_offload_bytes=0))
    plain = saved(None)
    assert type(back) is TwoTensor and back.shape == plain.shape and back.stride() == plain.stride()
    assert torch.equal(bits(back.a), bits(plain.a)) and torch.equal(bits(back.b), bits(plain.b))


@pytest.mark.parametrize("sync", SYNCS)
def test_a_two_tensor_leaf_that_requires_grad_is_a_parameter_and_stays_whole(sync):
    torch.manual_seed(0)
    p = TwoTensor(torch.randn(32, 32, device=DEV), torch.randn(32, 32, device=DEV)).requires_grad_()
    w = torch.randn(32, 32, device=DEV)

    def forward():
        # sin saves p (a leaf that requires grad), then p[:8] (a view of it); mul saves w's slice.
        return p.sin().sum() + (p[:8].sin() * w[:8]).cos().sum()

    ref = run(None, forward, [p])
    manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=0)
    got = run(manager, forward, [p])
    assert_bitwise([ref[0].a, ref[0].b, ref[1].a, ref[1].b], [got[0].a, got[0].b, got[1].a, got[1].b])
    s = manager.stats()
    # p and p[:8] stay as parameters (as a plain tensor would, and as from C++); the product,
    # saved by cos, and w's slice are offloaded (the product through its inner tensors).
    assert s.passed_leaf == 2 and s.passed_subclass == 0, s
    assert s.tensors_offloaded == 3, s


class Opaque(torch.Tensor):
    """A tensor subclass without __tensor_flatten__ (real storage, __torch_function__ only)."""


def test_unknown_subclass_passes_through_with_one_warning_per_type():
    x = torch.randn(64, 64, device=DEV).as_subclass(Opaque).requires_grad_()
    manager = torch_offload.Manager(DEV, min_offload_bytes=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with manager:
                loss = (x * 2).sin().sum()  # sin saves an Opaque non-leaf
            loss.backward()
    mine = [w for w in caught if issubclass(w.category, torch_offload.OffloadWarning)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert "test_rule.Opaque" in str(mine[0].message) and "passed_subclass" in str(mine[0].message)
    # The user's line, not torch's (Tensor.__torch_function__ runs the op) nor the package's.
    assert mine[0].filename == __file__
    s = manager.stats()
    assert s.passed_subclass == 2 and s.tensors_offloaded == 0


class BadUnflatten(TwoTensor):
    """A traceable subclass whose __tensor_unflatten__ fails."""

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        raise ValueError("no way back")


def test_a_failing_flatten_round_trip_raises_at_pack_naming_the_type_and_exclude_types_opts_out():
    a = torch.randn(64, 64, device=DEV)
    w = torch.randn(64, 64, device=DEV, requires_grad=True)
    manager = torch_offload.Manager(DEV, min_offload_bytes=0)
    with pytest.raises(
        RuntimeError,
        match=r"cannot offload a saved test_rule\.BadUnflatten: .*round trip failed "
        r"\(ValueError: no way back\).*exclude_types=\(BadUnflatten,\)",
    ):
        with manager:
            (BadUnflatten(a, a) * w).sin().sum()
    assert manager.stats().tensors_offloaded == 0
    # Nested: the outer round trip works, an inner one fails. Nothing of the
    # outer tensor is offloaded either (the tree is checked first).
    nested = torch_offload.Manager(DEV, min_offload_bytes=0)
    with pytest.raises(RuntimeError, match=r"cannot offload a saved test_rule\.BadUnflatten"):
        with nested:
            (TwoTensor(a * 1, BadUnflatten(a, a)) * w).sum()
    assert nested.stats().tensors_offloaded == 0 and nested.stats().bytes_offloaded == 0

    # Opted out: the graph trains without offloading that type.
    def forward():
        return (BadUnflatten(a, a) * w).sin().sum()

    ref = run(None, forward, [w])
    kept = torch_offload.Manager(DEV, min_offload_bytes=0, exclude_types=(BadUnflatten,))
    got = run(kept, forward, [w])
    assert torch.equal(bits(got[1]), bits(ref[1]))
    assert kept.stats().passed_excluded >= 1 and kept.stats().tensors_offloaded == 0


def test_exclude_types_must_be_tensor_subclasses():
    for bad in (int, (TwoTensor, "x"), torch.Tensor, torch.nn.Parameter):
        with pytest.raises(TypeError, match="exclude_types must be tensor subclasses"):
            torch_offload.Manager(DEV, exclude_types=bad)
    with pytest.raises(TypeError, match=r"got 'TwoTensor' \(a name, not the type\)"):
        torch_offload.Manager(DEV, exclude_types="TwoTensor")  # the name, whole
    torch_offload.Manager(DEV, exclude_types=TwoTensor)  # a single type


@contextlib.contextmanager
def one_rank_mesh():
    """A process group of one rank on the test device (gloo beside it for
    CPU tensors) and its 1-D device mesh; destroyed on exit."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    backend = f"cpu:gloo,{DEV}:{torch_offload.sim.collective_backend}" if DEV == "sim" else "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh(DEV, (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sync", SYNCS)
def test_dtensor_activation_is_offloaded_and_comes_back_a_dtensor(sync):
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    with one_rank_mesh() as mesh:
        torch.manual_seed(0)
        weight = torch.nn.Parameter(distribute_tensor(torch.randn(64, 64, device=DEV), mesh, [Replicate()]))
        local = torch.randn(16, 64, device=DEV, requires_grad=True)

        def forward():
            x = DTensor.from_local(local * 1, mesh, [Replicate()], run_check=False)
            return (x @ weight).sin().sum().to_local()

        ref = run(None, forward, [weight, local])
        manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=0)
        got = run(manager, forward, [weight, local])
        assert type(got[1]) is DTensor and got[1].placements == ref[1].placements
        assert_bitwise([ref[0], ref[1].to_local(), ref[2]], [got[0], got[1].to_local(), got[2]])
        s = manager.stats()
        # mm saves x (offloaded through its local tensor) and the DTensor parameter (stays);
        # sin saves its input (offloaded through its local tensor).
        assert s.tensors_seen == 3 and s.passed_leaf == 1
        assert s.tensors_offloaded == 2 and s.bytes_offloaded == 2 * 16 * 64 * 4
        assert s.passed_subclass == 0

        with manager:
            x = DTensor.from_local(local, mesh, [Replicate()], run_check=False)
            out = (x @ weight).sin()
        back = out.grad_fn._saved_self
        assert type(back) is DTensor and back.placements == (Replicate(),) and back.device_mesh == mesh


@pytest.mark.parametrize("sync", SYNCS)
def test_a_dtensor_parameters_to_local_stays_and_a_frozen_ones_with_exclude(sync):
    from torch.distributed.tensor import Replicate, distribute_tensor

    with one_rank_mesh() as mesh:
        torch.manual_seed(0)
        weight = torch.nn.Parameter(distribute_tensor(torch.randn(64, 64, device=DEV), mesh, [Replicate()]))
        frozen = torch.nn.Parameter(
            distribute_tensor(torch.randn(64, 64, device=DEV), mesh, [Replicate()]), requires_grad=False
        )
        x = torch.randn(16, 64, device=DEV, requires_grad=True)

        def forward():
            # as an expert layer with custom kernels does: the weight's local tensor, a plain view
            h = (x * 1) @ weight.to_local()  # saves x * 1 (offloaded) and weight's local (stays)
            h = torch.nn.functional.linear(h, weight.to_local())  # saves h (offloaded), to_local().t() (stays)
            return (h @ frozen.to_local()).sum()  # saves the frozen local (offloaded unless excluded)

        ref = run(None, forward, [weight, x])
        manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=0)
        got = run(manager, forward, [weight, x])
        assert_bitwise([ref[0], ref[1].to_local(), ref[2]], [got[0], got[1].to_local(), got[2]])
        s = manager.stats()
        assert s.tensors_seen == 5 and s.passed_leaf == 2 and s.tensors_offloaded == 3

        module = torch.nn.Module()
        module.weight, module.frozen = weight, frozen
        manager = torch_offload.Manager(DEV, sync=sync, min_offload_bytes=0)
        manager.exclude(module)  # a DTensor parameter stands for its local tensor
        got = run(manager, forward, [weight, x])
        assert_bitwise([ref[0], ref[1].to_local(), ref[2]], [got[0], got[1].to_local(), got[2]])
        s = manager.stats()
        assert s.passed_leaf == 2 and s.passed_excluded == 1 and s.tensors_offloaded == 2
        assert s.bytes_offloaded == 2 * 16 * 64 * 4


@pytest.mark.parametrize("sync", SYNCS)
def test_a_jagged_nested_tensor_comes_back_with_its_ragged_size(sync):
    # Its ragged size is a nested int made per offsets tensor object: the
    # offsets stay as that object (passed_subclass), the values are offloaded.
    torch.manual_seed(0)
    lengths = [3, 5] * 80  # offsets: 161 int64
    nt = torch.nested.nested_tensor([torch.randn(n, 64) for n in lengths], layout=torch.jagged, device=DEV)
    w = torch.randn(64, device=DEV, requires_grad=True)

    def forward():
        return (nt * w).sin().values().sum()  # mul saves nt, sin saves nt * w: jagged both

    ref = run(None, forward, [w])
    manager = torch_offload.Manager(DEV, sync=sync)
    got = run(manager, forward, [w])
    assert_bitwise(ref, got)
    s = manager.stats()
    # each jagged tensor saved: its values offloaded, its offsets kept
    assert s.tensors_offloaded >= 2 and s.bytes_offloaded == s.tensors_offloaded * sum(lengths) * 64 * 4
    assert s.passed_subclass == s.tensors_offloaded


def test_exclude_a_wrapper_subclass_covers_its_inner_tensors():
    a, b = torch.randn(64, 64, device=DEV), torch.randn(64, 64, device=DEV)
    w = torch.randn(64, 64, device=DEV, requires_grad=True)
    cache = TwoTensor(a, b)
    manager = torch_offload.Manager(DEV, min_offload_bytes=0)
    manager.exclude(cache)
    with manager:
        loss = (cache * w).sum()  # mul saves the cache: both inner tensors
    loss.backward()
    s = manager.stats()
    assert s.passed_excluded == 2 and s.tensors_offloaded == 0

    class NoFlatten(TwoTensor):
        def __tensor_flatten__(self):
            raise ValueError("opaque")

    other = torch_offload.Manager(DEV, min_offload_bytes=0)
    with pytest.raises(
        RuntimeError, match=r"exclude: cannot find the storage of a .*NoFlatten: .*\(ValueError: opaque\)"
    ):
        other.exclude([a, NoFlatten(a, b)])
    with other:  # nothing was excluded, a included
        loss = (a * w).sum()
    loss.backward()
    assert other.stats().passed_excluded == 0 and other.stats().tensors_offloaded == 1


def test_exclude_a_module_covers_frozen_parameters_and_buffers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64)).to(DEV)
    x = torch.randn(16, 64, device=DEV, requires_grad=True)
    counts = []
    for exclude in (False, True):
        manager = torch_offload.Manager(DEV, min_offload_bytes=0)
        if exclude:
            manager.exclude(model)
        with manager:
            loss = model(x * 1).sum()  # batch_norm saves its running mean and variance (buffers)
        loss.backward()
        counts.append((manager.stats().passed_excluded, manager.stats().tensors_offloaded))
    (excluded_before, offloaded_before), (excluded, offloaded) = counts
    assert excluded_before == 0 and excluded >= 2 and offloaded == offloaded_before - excluded


def test_warnings_are_offload_warnings_catchable_and_filterable():
    manager = torch_offload.Manager(DEV, min_offload_bytes=0)
    cpu = cases.leaf("cpu", 8, 8)

    def scope():
        with manager:
            (cpu * 2).sin().sum()  # saved on the CPU only: "nothing was offloaded" at exit

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scope()
    mine = [w for w in caught if issubclass(w.category, torch_offload.OffloadWarning)]
    assert len(mine) == 1 and "none was on a" in str(mine[0].message)
    assert issubclass(torch_offload.OffloadWarning, UserWarning)
    assert mine[0].filename == __file__, mine[0].filename  # the user's `with`, not the package's line

    again = torch_offload.Manager(DEV, min_offload_bytes=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=torch_offload.OffloadWarning)
        with pytest.raises(torch_offload.OffloadWarning, match="none was on a"):
            with again:
                (cpu * 2).sin().sum()
    quiet = torch_offload.Manager(DEV, min_offload_bytes=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=torch_offload.OffloadWarning)
        with quiet:
            (cpu * 2).sin().sum()
    assert not [w for w in caught if issubclass(w.category, torch_offload.OffloadWarning)]
