# SPDX-License-Identifier: MIT
"""What a new user meets first: errors in Python's own terms, a bool that
must be a bool, a device index the process does not have, and a repr that
says which device was detected."""

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
