# SPDX-License-Identifier: MIT
"""What a new user meets first: errors in Python's own terms, a bool that
must be a bool, a device index the process does not have, and a repr that
says which device was detected; docs/python.md's complete examples run as
written."""

import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import torch_offload
import torch_offload.sim  # noqa: F401  (the sim device module: device_count())
from testdevice import DEV


def test_range_errors_name_the_python_api_and_write_powers_of_two_as_such():
    with pytest.raises(
        ValueError, match=r"^torch_offload\.Manager: min_offload_bytes must be in \[0, 2\*\*50\], got -1$"
    ):
        torch_offload.Manager(DEV, min_offload_bytes=-1)
    with pytest.raises(ValueError, match=r"^torch_offload\.Manager: max_fwd_stash must be in \[1, 1024\], got 0$"):
        torch_offload.Manager(DEV, max_fwd_stash=0)
    with pytest.raises(TypeError, match=r"host_budget_bytes must be an int in \[0, 2\*\*50\], got float"):
        torch_offload.Manager(DEV, host_budget_bytes=1.5)


@pytest.mark.parametrize("value", [1, 0, 0.0, 1.0, "yes"])
def test_pin_memory_takes_a_bool_only(value):
    with pytest.raises(TypeError, match=f"pin_memory must be a bool, got {type(value).__name__}"):
        torch_offload.Manager(DEV, pin_memory=value)
    assert torch_offload.Manager(DEV, pin_memory=True).options["pin_memory"] is True


def test_a_device_index_the_process_does_not_have_is_an_error_naming_it():
    count = torch.get_device_module(DEV).device_count()
    assert count >= 1
    with pytest.raises(ValueError, match=rf"device {DEV}:{count} is not there: this process has {count} {DEV}"):
        torch_offload.Manager(f"{DEV}:{count}")
    with pytest.raises(ValueError, match=rf"device {DEV}:{count + 5} is not there"):
        torch_offload.Manager(torch.device(DEV, count + 5))
    assert torch_offload.Manager(f"{DEV}:{count - 1}").describe().startswith(f"Manager<{DEV},")


def test_repr_names_the_device_that_was_detected_or_requested():
    assert repr(torch_offload.Manager(DEV)).endswith(f"; device requested: {DEV!r})")
    detected = repr(torch_offload.Manager("auto"))
    assert detected.startswith("torch_offload.Manager(Manager<")
    assert detected.endswith(f"; device detected: {DEV!r})")
    assert "'auto'" not in detected


def test_the_package_namespace_holds_its_api_not_its_imports():
    public = {n for n in dir(torch_offload) if not n.startswith("_")}
    assert not public & {"torch", "os", "ctypes", "warnings", "threading"}
    assert {"Manager", "no_offload", "OffloadActivations", "trl", "torchtune"} <= public


def test_the_drop_ins_repr_names_their_own_class():
    assert repr(torch_offload.OffloadActivations()).startswith("torch_offload.OffloadActivations(")


def run_doc_example(name):
    """Runs docs/python.md's `<!-- example:python NAME -->` block as
    written, on the detected accelerator (the test device), with its output
    silenced; returns its namespace and the last step's device peak, and
    fails on any OffloadWarning (a target the plan said it cannot meet)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = open(os.path.join(root, "docs", "python.md"), encoding="utf-8").read()
    found = re.search(rf"<!-- example:python {re.escape(name)} -->\s*```python\n(.*?)```", text, re.S)
    assert found, f"docs/python.md has no example {name!r}"
    code = found.group(1)
    assert len(code.splitlines()) < 30, f"example {name!r} should stay under 30 lines"
    namespace = {"print": lambda *args, **kwargs: None}
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_offload.OffloadWarning)
        exec(compile(code, f"docs/python.md ({name})", "exec"), namespace)
    return namespace, torch.accelerator.max_memory_allocated()


def test_the_plain_pytorch_example_of_docs_python_md_meets_its_target():
    namespace, peak = run_doc_example("plain")
    manager = namespace["manager"]
    target = manager.options["device_target_bytes"]
    assert 0 < peak <= target * 1.02, (peak, target, namespace["planned"].summary())
    stats = manager.stats()
    assert stats.blocks_kept + stats.blocks_offloaded + stats.blocks_recomputed == 8
    assert stats.blocks_kept > 0 and stats.bytes_offloaded > 0, namespace["planned"].summary()


def test_installing_sim_after_a_backward_pass_raises_at_once_what_to_do():
    # In a fresh process (this one installed sim long ago): a notebook that
    # ran a CPU backward pass first once met PyTorch's "INTERNAL ASSERT
    # FAILED ... device_ready_queues_" at its first backward on sim.
    code = (
        "import torch\n"
        "a = torch.ones(2, requires_grad=True)\n"
        "(a * 2).sum().backward()\n"
        "import torch_offload.sim\n"
        "try:\n"
        "    torch_offload.sim.install()\n"
        "except RuntimeError as e:\n"
        "    print('raised:', e, torch_offload.sim._sim.installed())\n"
        "else:\n"
        "    x = torch.ones(2, device='sim', requires_grad=True)\n"
        "    (x * 2).sum().backward()\n"
        "    print('installed')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "sim::install: a backward pass ran in this process before sim was loaded" in out.stdout, out.stdout
    assert "import torch_offload.sim and call install() first" in out.stdout
    assert out.stdout.rstrip().endswith("False"), out.stdout  # raised before anything changed
    fine = code.replace("(a * 2).sum().backward()\n", "")  # no backward before: it installs and runs backward
    out = subprocess.run([sys.executable, "-c", fine], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "installed\n", (out.stdout, out.stderr)


def test_report_says_per_module_what_was_offloaded_and_why_the_rest_stayed():
    # Stats give counts, not reasons a user can place: report() names the
    # module, its bytes offloaded and kept, and each reason for what stayed.
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64), torch.nn.LayerNorm(64)
    ).to(DEV)
    model.register_buffer("scale", torch.full((32, 64), 0.5, device=DEV))  # a constant the loss multiplies by
    manager = torch_offload.Manager(DEV, min_offload_bytes=4096)
    manager.exclude(model.buffers())
    with pytest.raises(RuntimeError, match=r"Manager\.report: no module is watched: call manager\.watch\(model\)"):
        manager.report()
    with pytest.raises(TypeError, match=r"Manager\.watch: model must be an nn\.Module, got int"):
        manager.watch(3)
    manager.watch(model)
    x = torch.randn(32, 64, device=DEV)
    for _ in range(2):  # the report is the last step's
        with manager:
            loss = (model(x) * model.scale).square().mean()
            loss.backward()
    report = manager.report()
    rows = {r.module: r for r in report.rows}
    assert set(rows) == {"0", "1", "2", "3", "(outside watched modules)"}, str(report)
    gelu = rows["1"]
    assert gelu.tensors_offloaded == gelu.tensors_seen == 1 and gelu.bytes_offloaded == 32 * 256 * 4
    first = rows["0"]  # its input (offloaded): x needs no gradient, so the weight is not saved
    assert (first.tensors_seen, first.bytes_offloaded, first.reasons) == (1, 32 * 64 * 4, {}), str(report)
    linear = rows["2"]  # its input (offloaded) and its weight (a parameter)
    assert linear.reasons == {"parameter": 1} and linear.bytes_offloaded == 32 * 256 * 4, str(report)
    assert linear.bytes_kept == 64 * 256 * 4  # the weight's own bytes
    norm = rows["3"]  # mean and rstd: 128 B each, under min_offload_bytes
    assert norm.reasons.get("small (min_offload_bytes)") == 2, str(report)
    outside = rows["(outside watched modules)"]
    assert outside.reasons.get("excluded") == 1 and outside.bytes_kept == 32 * 64 * 4, str(report)
    stats = manager.stats()
    assert sum(r.tensors_seen for r in report.rows) == stats.tensors_seen // 2
    text = str(report)
    assert text.splitlines()[0].split() == [
        "module",
        "saved",
        "offloaded",
        "bytes",
        "offloaded",
        "bytes",
        "kept",
        "kept",
        "because",
    ]
    assert "small (min_offload_bytes) 2" in text and "excluded 1" in text


def test_a_forward_on_another_thread_while_a_scope_is_open_warns_once():
    # Saved-tensor hooks are per thread: a forward run on a worker thread
    # while the main thread's `with manager:` is open offloads nothing, and
    # said nothing.
    import threading

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU()).to(DEV)
    manager = torch_offload.Manager(DEV)
    x = torch.randn(32, 64, device=DEV)

    def worker():
        model(x).sum().backward()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with manager:
            for _ in range(2):
                t = threading.Thread(target=worker)
                t.start()
                t.join()
            model(x).sum().backward()  # on the scope's own thread: no warning
        worker()  # no scope open anywhere: no warning
        with torch_offload.no_offload():  # hooks of its own on this thread: no warning
            with manager:
                pass
    ours = [str(w.message) for w in caught if issubclass(w.category, torch_offload.OffloadWarning)]
    assert len(ours) == 1, ours
    assert "ran forward with grad on a thread where no `with manager:` is open" in ours[0]
    assert manager.stats().tensors_offloaded > 0


def test_a_watched_model_unwatches_names_its_rows_and_saves_with_inert_hooks():
    import io

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU()).to(DEV)
    manager = torch_offload.Manager(DEV)
    with pytest.raises(TypeError, match=r"Manager\.watch: name must be a str, got int"):
        manager.watch(model, name=1)
    manager.watch(model, name="net")
    x = torch.randn(32, 64, device=DEV)
    with manager:
        model(x).sum().backward()
    assert {r.module for r in manager.report().rows} == {"net.0", "net.1"}  # sum() saves nothing
    buffer = io.BytesIO()
    torch.save(model, buffer)  # its hooks pickle as hooks that do nothing
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    loaded(x).sum().backward()
    manager.unwatch()
    assert not model[0]._forward_pre_hooks and not model[0]._forward_hooks
    with pytest.raises(RuntimeError, match="no module is watched"):
        manager.report()


def test_a_sparse_saved_tensor_stays_counted_as_layout_without_bytes():
    # bytes_kept counts strided tensors' own bytes; nbytes() refuses a sparse
    # COO tensor, so counting it raised from the pack.
    class SavesCsr(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(torch.ones(64, 64, device=x.device).to_sparse_csr())
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            (csr,) = ctx.saved_tensors
            assert csr.layout == torch.sparse_csr
            return grad * 2

    manager = torch_offload.Manager(DEV)
    x = torch.randn(64, 64, device=DEV, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # sparse CSR support is in beta
        with manager:
            SavesCsr.apply(x).sum().backward()
    stats = manager.stats()
    assert stats.passed_layout == 1 and stats.bytes_kept == 0, stats
    assert torch.equal(x.grad, torch.full_like(x, 2))


def test_a_scope_closed_with_an_error_leaves_nothing_open():
    # __exit__ raising (its out-of-order warning made an error) left the
    # manager registered as open: later forwards on other threads warned.
    import torch_offload._report as report

    manager = torch_offload.Manager(DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_offload.OffloadWarning)
        manager.__enter__()
        torch._C._autograd._pop_saved_tensors_default_hooks()  # another tool popped ours
        with pytest.raises(torch_offload.OffloadWarning, match="no longer on torch's stack"):
            manager.__exit__(None, None, None)
    assert manager not in report._open
