# SPDX-License-Identifier: MIT
"""DDP and FSDP2 with offloading, 2 ranks on sim (processes on 127.0.0.1,
collectives through the offload_sim backend), copy delay and poisoning on.

One process pair per family (dist_worker.py) runs every model
configuration, sync and place of backward; each case here reads its
verdict: losses, gradients and parameters bitwise equal to the same
distributed run without offloading, something offloaded, no parameter
storage offloaded."""

import functools
import json
import os
import socket
import subprocess
import sys

import pytest

import dist_worker
from testdevice import sim_only

pytestmark = sim_only("2 ranks on sim, collectives through the offload_sim backend")

WORLD = 2
TIMEOUT_S = 240


def listening_socket():
    """A socket bound to 127.0.0.1 on a free port, listening: rank 0's store serves on it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@functools.cache
def all_verdicts(tmp):
    """Runs the rank pairs of every family at once; returns {family: each rank's results}."""
    runs = {}
    for family in dist_worker.CONFIGS:
        with listening_socket() as sock:
            port, fd = sock.getsockname()[1], sock.fileno()
            outs = [os.path.join(tmp, f"{family}-{rank}.json") for rank in range(WORLD)]
            procs = [subprocess.Popen([sys.executable, dist_worker.__file__, family, str(rank), str(WORLD), str(port),
                                       str(fd if rank == 0 else -1), outs[rank]], pass_fds=[fd] if rank == 0 else [],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for rank in range(WORLD)]
        runs[family] = (outs, procs)
    verdicts = {}
    try:
        for family, (outs, procs) in runs.items():
            logs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
            for rank, p in enumerate(procs):
                assert p.returncode == 0, f"rank {rank} of {family} exited with {p.returncode}:\n{logs[rank][-3000:]}"
            verdicts[family] = []
            for out in outs:
                with open(out) as f:
                    verdicts[family].append(json.load(f))
    finally:
        for _, procs in runs.values():
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return verdicts


def verdicts(family, tmp):
    return all_verdicts(tmp)[family]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dist"))


CASES = [(family, f"{name}-{sync}-{place}") for family, configs in dist_worker.CONFIGS.items() for name in configs
         for sync in dist_worker.SYNCS for place in dist_worker.PLACES]


@pytest.mark.parametrize("family,case", CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_bitwise_parity_on_two_ranks(family, case, tmp):
    for rank, results in enumerate(verdicts(family, tmp)):
        assert results[case] == "ok", f"rank {rank}: {results[case]}"


@pytest.mark.parametrize("family", list(dist_worker.CONFIGS))
def test_the_parameter_watch_sees_an_offloaded_parameter_storage(family, tmp):
    for results in verdicts(family, tmp):
        assert results["positive_control"] == 1


@pytest.mark.parametrize("family", list(dist_worker.CONFIGS))
def test_the_store_does_not_grow_with_the_number_of_collectives(family, tmp):
    for results in verdicts(family, tmp):
        assert results["store_keys_grown"] <= 3  # at most one barrier's keys not yet deleted


@pytest.mark.parametrize("call,message", dist_worker.collective_rows())
def test_bad_input_row_unsupported_collective(call, message, tmp):
    for rank, results in enumerate(verdicts("ddp", tmp)):
        assert results["unsupported"][call] == message, f"rank {rank}"


def test_the_collectives_table_is_there():
    assert len(dist_worker.collective_rows()) >= 5
