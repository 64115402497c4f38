# SPDX-License-Identifier: MIT
"""DDP, FSDP2, DTensor tensor and sequence parallel, FSDP2 x TP and
pipeline schedules with offloading, on sim (processes on 127.0.0.1,
collectives through the offload_sim backend), copy delay and poisoning on.

One process set per family (dist_worker.py; 2 ranks, FSDP2 x TP 4), all
families started at once, runs every model configuration, sync and place
of backward; each case here reads its verdict: losses, gradients and
parameters bitwise equal to the same distributed run without offloading,
something offloaded, no parameter storage offloaded. The runs without
offloading are cases of their own (and, for the model-parallel families,
match the same model trained in one process up to rounding). A rank that
dies ends its family's ranks; the cases it had not reached fail with its
exit status and the end of its output. The ranks are on sim whatever the
suite's device (below)."""

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import dist_worker
from testdevice import sim_only  # noqa: F401  (cases that need sim in this process)

# The ranks run on sim in processes of their own whatever the suite's
# device (OFFLOAD_TEST_DEVICE): two NCCL ranks cannot share one GPU, and
# gloo has no CUDA reduce-scatter for FSDP2, so on a one-GPU machine the
# CUDA pass runs them as they run on sim.

TIMEOUT_S = 420


def listening_socket():
    """A socket bound to 127.0.0.1 on a free port, listening: rank 0's store serves on it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def start_family(family, tmp):
    """Starts the ranks of `family`; returns [(process, its output file, its JSON path)]."""
    world = dist_worker.FAMILIES[family]["world"]
    ranks = []
    with listening_socket() as sock:
        port, fd = sock.getsockname()[1], sock.fileno()
        for rank in range(world):
            out = os.path.join(tmp, f"{family}-{rank}.json")
            log = open(os.path.join(tmp, f"{family}-{rank}.log"), "w+")
            proc = subprocess.Popen(
                [
                    sys.executable,
                    dist_worker.__file__,
                    family,
                    str(rank),
                    str(world),
                    str(port),
                    str(fd if rank == 0 else -1),
                    out,
                ],
                pass_fds=[fd] if rank == 0 else [],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
            ranks.append((proc, log, out))
    return ranks


@functools.cache
def all_verdicts(tmp):
    """Runs the ranks of every family at once; returns {family: (each rank's
    results, None or why the family stopped early)}. A rank that exits with
    an error (or a crash) ends the other ranks of its family at once."""
    runs = {family: start_family(family, tmp) for family in dist_worker.FAMILIES}
    stopped = {}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(proc.poll() is None for ranks in runs.values() for proc, _, _ in ranks):
            for family, ranks in runs.items():
                for rank, (proc, log, _) in enumerate(ranks):
                    if family not in stopped and proc.poll() not in (None, 0):
                        log.seek(0)
                        status = proc.returncode
                        how = f"signal {signal.Signals(-status).name}" if status < 0 else f"status {status}"
                        stopped[family] = f"rank {rank} of {family} ended with {how}:\n{log.read()[-3000:]}"
                        for other, _, _ in ranks:
                            if other.poll() is None:
                                other.kill()
            if time.monotonic() > deadline:
                for family, ranks in runs.items():
                    if any(proc.poll() is None for proc, _, _ in ranks):
                        stopped.setdefault(family, f"{family} did not finish within {TIMEOUT_S} s")
                break
            time.sleep(0.1)
    finally:
        for ranks in runs.values():
            for proc, log, _ in ranks:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                log.close()
    verdicts = {}
    for family, ranks in runs.items():
        results = []
        for _, _, out in ranks:
            try:
                with open(out) as f:
                    results.append(json.load(f))
            except FileNotFoundError:
                results.append({})
        verdicts[family] = (results, stopped.get(family))
    return verdicts


def verdicts(family, key, tmp):
    """Each rank's verdict on `key` (asserting every rank reached it)."""
    results, stopped = all_verdicts(tmp)[family]
    for rank, r in enumerate(results):
        assert key in r, f"rank {rank} did not report {key}: " + (stopped or "its results lack it")
    return [r[key] for r in results]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dist"))


CASES = [(family, case) for family in dist_worker.FAMILIES for case in dist_worker.cases(family)]
REFERENCES = [(family, name) for family, spec in dist_worker.FAMILIES.items() for name in spec["configs"]]


@pytest.mark.parametrize("family,case", CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_bitwise_parity(family, case, tmp):
    for rank, verdict in enumerate(verdicts(family, case, tmp)):
        assert verdict == "ok", f"rank {rank}: {verdict}"


@pytest.mark.parametrize("family,name", REFERENCES, ids=[f"{f}-{n}" for f, n in REFERENCES])
def test_the_run_without_offloading(family, name, tmp):
    for rank, verdict in enumerate(verdicts(family, f"{name}-reference", tmp)):
        assert verdict == "ok", f"rank {rank}: {verdict}"


@pytest.mark.parametrize("family", list(dist_worker.FAMILIES))
def test_the_parameter_watch_sees_an_offloaded_parameter_storage(family, tmp):
    assert verdicts(family, "positive_control", tmp) == [1] * dist_worker.FAMILIES[family]["world"]


@pytest.mark.parametrize("family", list(dist_worker.FAMILIES))
def test_the_store_does_not_grow_with_the_number_of_collectives(family, tmp):
    for grown in verdicts(family, "store_keys_grown", tmp):
        assert grown <= dist_worker.FAMILIES[family]["world"] + 1  # at most the last barrier's keys not yet deleted


@pytest.mark.parametrize("call,message", dist_worker.collective_rows())
def test_bad_input_row_unsupported_collective(call, message, tmp):
    for rank, got in enumerate(verdicts("ddp", "unsupported", tmp)):
        assert got[call] == message, f"rank {rank}"


def test_the_collectives_table_is_there():
    assert len(dist_worker.collective_rows()) >= 5
