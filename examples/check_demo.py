# SPDX-License-Identifier: MIT
"""Checks of offload-demo, run by Meson (examples/meson.build).

usage: check_demo.py tiny|lstm|cap-oom|ranks|checkpoint|bad-input PATH/TO/offload-demo

tiny       3 steps of a tiny model on sim, without and with offloading:
           losses bitwise equal (max_abs_loss_diff == 0), a lower peak of
           device memory with offloading, bytes offloaded and brought back,
           and (when matplotlib is importable) a PNG and its CSV.
lstm       the same with --model lstm (2 layers), without the plot.
cap-oom    the model with two layers under a device-memory cap half way between the
           two peaks: the run without offloading runs out of device memory,
           the offloaded run trains every step; a third run with
           --device-target under the cap ("offload (target)") trains every
           step with the same losses, within the cap, keeps something on
           the device and moves fewer bytes than offloading everything.
ranks      the tiny model trained data-parallel by 2 processes (--ranks 2):
           rank 0 reports losses bitwise equal with and without offloading
           on every rank and the same final parameters on every rank, and
           offloaded something; no rank is left running.
checkpoint --checkpoint on a 4-block tiny model: the checkpointed runs'
           losses bitwise equal the run without offloading; checkpoint +
           offload moves only block inputs (fewer bytes than offloading
           alone). Then under a host budget of what checkpoint + offload
           holds on the host, and a device-memory cap half way between the
           two offloaded peaks: plain offloading (which keeps on the device
           what exceeds the budget) runs out of device memory, checkpoint +
           offload trains every step with the same losses.
bad-input  an unavailable --device exits with status 2, prints exactly one
           line on stderr naming the flag, and trains nothing (inputs with
           a fixed message are rows of docs/bad-input.md, checked verbatim
           by tests/tools/bad_input.py).

The training text is this file (a small ASCII text), so the checks do not
depend on what the machine ships. Only the standard library is needed.
"""

import json
import os
import subprocess
import sys
import tempfile

TINY = [
    "--layers",
    "1",
    "--width",
    "32",
    "--heads",
    "2",
    "--seq",
    "32",
    "--batch",
    "4",
    "--steps",
    "3",
    "--device",
    "sim",
    "--data",
    os.path.abspath(__file__),
]


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def run_demo(demo, args, timeout=90):
    proc = subprocess.run([demo] + args, capture_output=True, text=True, timeout=timeout)
    return proc


def summary(demo, extra, tmp, name, base=TINY):
    path = os.path.join(tmp, name + ".json")
    proc = run_demo(demo, base + ["--summary-json", path] + extra)
    print(proc.stdout)
    if proc.returncode != 0:
        fail(f"offload-demo exited with {proc.returncode}: {proc.stderr.strip()}")
    with open(path) as f:
        return json.load(f), proc


def check_tiny(demo, model="gpt"):
    with tempfile.TemporaryDirectory() as tmp:
        plot = None
        if model == "gpt":
            try:
                import matplotlib  # noqa: F401  (only whether the PNG can be checked too)

                plot = os.path.join(tmp, "memory.png")
            except ImportError:
                print("matplotlib not importable here: skipping the --plot check")
        extra = (["--plot", plot] if plot else []) + (["--model", model] if model != "gpt" else [])
        base = TINY
        if model != "gpt":  # no attention heads: TINY without "--heads 2"
            at = TINY.index("--heads")
            base = TINY[:at] + TINY[at + 2 :]
        s, _ = summary(demo, extra, tmp, "tiny", base)
        if s["model"]["name"] != model:
            fail(f"the summary names model {s['model']['name']!r}, expected {model!r}")
        if s["steps"] != 3 or len(s["losses_none"]) != 3 or len(s["losses_offload"]) != 3:
            fail(f"expected 3 losses per run, got {s['losses_none']!r} and {s['losses_offload']!r}")
        if s["max_abs_loss_diff"] != 0:
            fail(f"max_abs_loss_diff is {s['max_abs_loss_diff']!r}, expected 0")
        if s["losses_none"] != s["losses_offload"]:
            fail(f"losses differ: {s['losses_none']!r} vs {s['losses_offload']!r}")
        if not s["peak_device_bytes_offload"] < s["peak_device_bytes_none"]:
            fail(
                f"peak_device_bytes_offload {s['peak_device_bytes_offload']!r} is not below peak_device_bytes_none "
                f"{s['peak_device_bytes_none']!r}"
            )
        if not s["bytes_offloaded"] > 0 or not s["bytes_reloaded"] > 0:
            fail(f"nothing was offloaded or brought back: {s['bytes_offloaded']!r} / {s['bytes_reloaded']!r}")
        if s["oom_without_offload"] or s["oom_step_without_offload"] is not None:
            fail("no cap was set, yet the run without offloading ran out of memory")
        if s["device"] != "sim:0" or s["data_files"] != [os.path.abspath(__file__)]:
            fail(f"unexpected device or data_files: {s['device']!r}, {s['data_files']!r}")
        if plot:
            with open(plot, "rb") as f:
                if f.read(8) != b"\x89PNG\r\n\x1a\n":
                    fail("--plot did not write a PNG")
            with open(os.path.splitext(plot)[0] + ".csv") as f:
                text = f.read()
            if "without offloading" not in text or "with offloading" not in text:
                fail("the plot's CSV lacks one of the runs")
    if s["stats_offload"]["bytes_offloaded"] != s["bytes_offloaded"]:
        fail(
            f"stats_offload.bytes_offloaded {s['stats_offload']['bytes_offloaded']!r} differs from bytes_offloaded "
            f"{s['bytes_offloaded']!r}"
        )
    print(
        f"ok: {model}, 3 steps, losses bitwise equal, peak {s['peak_device_bytes_offload']} < "
        f"{s['peak_device_bytes_none']} bytes, {s['bytes_offloaded']} bytes offloaded"
    )


# cap-oom's model: two layers. With one, the room between the offloaded
# peak and the target (about 50 KB) is less than what the plan sets aside
# at every point (the largest storage for what an operation allocates, and
# backward's prefetch window), so the plan keeps nothing there.
CAP_OOM = ["--layers", "2"] + TINY[2:]


def check_cap_oom(demo):
    with tempfile.TemporaryDirectory() as tmp:
        s, _ = summary(demo, [], tmp, "free", CAP_OOM)
        cap = (s["peak_device_bytes_none"] + s["peak_device_bytes_offload"]) // 2
        target = (3 * cap + s["peak_device_bytes_offload"]) // 4
        c, proc = summary(
            demo, ["--device-memory-cap", str(cap), "--device-target", str(target)], tmp, "capped", CAP_OOM
        )
        if not c["oom_without_offload"] or not isinstance(c["oom_step_without_offload"], int):
            fail(f"with cap {cap} the run without offloading did not run out of memory")
        if c["oom_with_offload"] or len(c["losses_offload"]) != 3:
            fail(f"with cap {cap} the offloaded run did not train all 3 steps")
        if c["losses_offload"] != s["losses_offload"]:
            fail("the capped offloaded run's losses differ from the uncapped one's")
        if "ran out of device memory at step" not in proc.stdout:
            fail("the output does not say that the run without offloading ran out of memory")
        t = c["target_run"]
        if c["device_target"] != target or t is None or t["name"] != "target":
            fail(f"--device-target {target}: the summary's device_target {c['device_target']!r}, target_run {t!r}")
        if t["oom_step"] is not None or t["losses"] != s["losses_offload"]:
            fail(
                f"with cap {cap} and target {target} the targeted run did not train 3 steps with the same losses: "
                f"{t['losses']!r}"
            )
        if not t["peak_device_bytes"] <= cap:
            fail(f"the targeted run's peak {t['peak_device_bytes']} is above the cap {cap}")
        moved, everything = t["bytes_offloaded"], c["bytes_offloaded"]
        if not 0 < moved < everything or t["stats"]["passed_target"] == 0:
            fail(
                f"the targeted run moved {moved} bytes (offloading everything {everything}) and kept "
                f"{t['stats']['passed_target']} tensors on the device"
            )
        header = [line for line in proc.stdout.splitlines() if "no offload" in line and "offload (" in line]
        if len(header) != 1 or "offload (target)" not in header[0]:
            fail(f"the table has no column 'offload (target)': {header!r}")
        if "offload (target): trained all 3 steps under the cap" not in proc.stdout:
            fail("the output does not say that the targeted run trained under the cap")
        # --plan auto, the same target without the cap: the automatic plan's
        # column, its losses bitwise, every block planned in the last step.
        a, proc = summary(demo, ["--device-target", str(target), "--plan", "auto"], tmp, "auto", CAP_OOM)
        r = a["auto_run"]
        if a["plan"] != "auto" or r is None or r["name"] != "auto" or r["losses"] != s["losses_offload"]:
            fail(f"--plan auto: the summary's auto_run {r!r} does not have the offloaded run's losses")
        blocks = r["stats"]["blocks_kept"] + r["stats"]["blocks_offloaded"] + r["stats"]["blocks_recomputed"]
        if blocks != 2 or "auto plan (target)" not in proc.stdout:
            fail(f"--plan auto: {blocks} blocks planned in the last step (the model has 2), or no 'auto plan' column")
    print(
        f"ok: cap {cap} bytes: no offload ran out at step {c['oom_step_without_offload']}, offload trained 3 steps; "
        f"target {target}: peak {t['peak_device_bytes']}, moved {moved} of {everything} bytes"
    )


def check_ranks(demo):
    with tempfile.TemporaryDirectory() as tmp:
        s, proc = summary(demo, ["--ranks", "2"], tmp, "ranks")
    line = (
        "data parallel (2 ranks, gradients averaged through c10d, offload_sim): losses bitwise equal with and "
        "without offloading on every rank; final parameters identical on every rank"
    )
    if line not in proc.stdout.splitlines():
        fail(f"rank 0 did not print {line!r}")
    if s["losses_none"] != s["losses_offload"] or len(s["losses_offload"]) != 3:
        fail(f"rank 0's losses: {s['losses_none']!r} vs {s['losses_offload']!r}")
    if not s["bytes_offloaded"] > 0:
        fail("nothing was offloaded")
    if proc.stdout.count("offload-demo ") != 1:
        fail(f"only rank 0 prints: {proc.stdout!r}")
    print(
        f"ok: 2 ranks, losses bitwise equal on every rank, same parameters, {s['bytes_offloaded']} bytes offloaded "
        "on rank 0"
    )


def check_checkpoint(demo):
    base = TINY[: TINY.index("--layers")] + ["--layers", "4"] + TINY[TINY.index("--layers") + 2 :] + ["--checkpoint"]
    with tempfile.TemporaryDirectory() as tmp:
        s, _ = summary(demo, [], tmp, "free", base)
        runs = {r["name"]: r for r in s["checkpoint_runs"]}
        if sorted(runs) != ["checkpoint", "checkpoint+streamed"]:
            fail(f"checkpoint_runs are {sorted(runs)!r}")
        for r in runs.values():
            if r["losses"] != s["losses_none"] or not r["losses_bitwise_equal_to_none"]:
                fail(f"{r['name']}: losses {r['losses']!r} differ from {s['losses_none']!r}")
            if not r["peak_device_bytes"] < s["peak_device_bytes_none"]:
                fail(f"{r['name']}: peak {r['peak_device_bytes']!r} not below {s['peak_device_bytes_none']!r}")
        both = runs["checkpoint+streamed"]
        if not 0 < both["bytes_offloaded"] < s["bytes_offloaded"] / 4:
            fail(
                f"checkpoint + offload moved {both['bytes_offloaded']!r} bytes, offload alone {s['bytes_offloaded']!r}"
            )
        budget = both["stats"]["host_bytes_reserved_peak"]  # the budget limits reserved bytes
        b, _ = summary(demo, ["--host-budget", str(budget)], tmp, "budget", base)
        both_b = [r for r in b["checkpoint_runs"] if r["name"] == "checkpoint+streamed"][0]
        if both_b["stats"]["passed_budget"] != 0 or b["stats_offload"]["passed_budget"] == 0:
            fail(
                f"with --host-budget {budget}: checkpoint + offload passed {both_b['stats']['passed_budget']!r} over "
                f"budget, offload alone {b['stats_offload']['passed_budget']!r}"
            )
        if not both_b["peak_device_bytes"] < b["peak_device_bytes_offload"]:
            fail(
                f"with --host-budget {budget}: checkpoint + offload peak {both_b['peak_device_bytes']!r} is not below "
                f"offload's {b['peak_device_bytes_offload']!r}"
            )
        # Plain offloading runs before the checkpointed runs and runs out of
        # device memory mid-forward: the runs after it start with nothing of
        # it held.
        cap = (both_b["peak_device_bytes"] + b["peak_device_bytes_offload"]) // 2
        c, proc = summary(demo, ["--host-budget", str(budget), "--device-memory-cap", str(cap)], tmp, "capped", base)
        both_c = [r for r in c["checkpoint_runs"] if r["name"] == "checkpoint+streamed"][0]
        if not c["oom_with_offload"]:
            fail(f"with cap {cap} and host budget {budget} plain offloading did not run out of memory")
        if both_c["oom_step"] is not None or both_c["losses"] != s["losses_none"]:
            fail(f"with cap {cap} checkpoint + offload did not train 3 steps with the same losses: {both_c!r}")
        if "checkpoint + offload (streamed): trained all 3 steps under the cap" not in proc.stdout:
            fail("the output does not say that checkpoint + offload trained under the cap")
    print(
        f"ok: checkpoint + offload moved {both['bytes_offloaded']} bytes (offload alone {s['bytes_offloaded']}); "
        f"host budget {budget}, cap {cap}: offload ran out at step {c['oom_step_with_offload']}, checkpoint + "
        "offload trained 3 steps"
    )


def check_bad_input(demo):
    # Every input with a fixed message is a row of docs/bad-input.md, checked
    # verbatim by tests/tools/bad_input.py. Here: the ones whose line depends on
    # the machine (the devices accepted on it).
    # (arguments, a word the one stderr line must contain)
    cases = [
        (["--device", "nosuchdevice"], "--device"),  # unavailable device
        (["--device", "xla"], "--device"),  # a LibTorch device type absent here
    ]
    results = [(case, run_demo(demo, TINY + case[0])) for case in cases]
    for (args, word), proc in results:
        lines = proc.stderr.strip().splitlines()
        shown = " ".join(args)
        if proc.returncode != 2:
            fail(f"{shown}: exit status {proc.returncode}, expected 2 (stderr: {proc.stderr!r})")
        if len(lines) != 1:
            fail(f"{shown}: expected one line on stderr, got {len(lines)}: {proc.stderr!r}")
        if word not in lines[0]:
            fail(f"{shown}: the stderr line does not name {word!r}: {lines[0]!r}")
        if proc.stdout.strip():
            fail(f"{shown}: printed on stdout before rejecting the input: {proc.stdout!r}")
        print(f"ok: {shown:<40} -> {lines[0]}")


def main():
    checks = {
        "tiny": check_tiny,
        "lstm": lambda demo: check_tiny(demo, "lstm"),
        "cap-oom": check_cap_oom,
        "bad-input": check_bad_input,
        "ranks": check_ranks,
        "checkpoint": check_checkpoint,
    }
    if len(sys.argv) != 3 or sys.argv[1] not in checks:
        print(__doc__)
        sys.exit(2)
    checks[sys.argv[1]](sys.argv[2])


if __name__ == "__main__":
    main()
