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

TINY = ["--layers", "1", "--width", "32", "--heads", "2", "--seq", "32", "--batch", "4",
        "--steps", "3", "--device", "sim", "--data", os.path.abspath(__file__)]


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
        fail("offload-demo exited with %d: %s" % (proc.returncode, proc.stderr.strip()))
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
            base = TINY[:at] + TINY[at + 2:]
        s, _ = summary(demo, extra, tmp, "tiny", base)
        if s["model"]["name"] != model:
            fail("the summary names model %r, expected %r" % (s["model"]["name"], model))
        if s["steps"] != 3 or len(s["losses_none"]) != 3 or len(s["losses_offload"]) != 3:
            fail("expected 3 losses per run, got %r and %r" % (s["losses_none"], s["losses_offload"]))
        if s["max_abs_loss_diff"] != 0:
            fail("max_abs_loss_diff is %r, expected 0" % s["max_abs_loss_diff"])
        if s["losses_none"] != s["losses_offload"]:
            fail("losses differ: %r vs %r" % (s["losses_none"], s["losses_offload"]))
        if not s["peak_device_bytes_offload"] < s["peak_device_bytes_none"]:
            fail("peak_device_bytes_offload %r is not below peak_device_bytes_none %r"
                 % (s["peak_device_bytes_offload"], s["peak_device_bytes_none"]))
        if not s["bytes_offloaded"] > 0 or not s["bytes_reloaded"] > 0:
            fail("nothing was offloaded or brought back: %r / %r" % (s["bytes_offloaded"], s["bytes_reloaded"]))
        if s["oom_without_offload"] or s["oom_step_without_offload"] is not None:
            fail("no cap was set, yet the run without offloading ran out of memory")
        if s["device"] != "sim:0" or s["data_files"] != [os.path.abspath(__file__)]:
            fail("unexpected device or data_files: %r, %r" % (s["device"], s["data_files"]))
        if plot:
            with open(plot, "rb") as f:
                if f.read(8) != b"\x89PNG\r\n\x1a\n":
                    fail("--plot did not write a PNG")
            with open(os.path.splitext(plot)[0] + ".csv") as f:
                text = f.read()
            if "without offloading" not in text or "with offloading" not in text:
                fail("the plot's CSV lacks one of the runs")
    if s["stats_offload"]["bytes_offloaded"] != s["bytes_offloaded"]:
        fail("stats_offload.bytes_offloaded %r differs from bytes_offloaded %r"
             % (s["stats_offload"]["bytes_offloaded"], s["bytes_offloaded"]))
    print("ok: %s, 3 steps, losses bitwise equal, peak %d < %d bytes, %d bytes offloaded"
          % (model, s["peak_device_bytes_offload"], s["peak_device_bytes_none"], s["bytes_offloaded"]))


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
        c, proc = summary(demo, ["--device-memory-cap", str(cap), "--device-target", str(target)], tmp, "capped",
                          CAP_OOM)
        if not c["oom_without_offload"] or not isinstance(c["oom_step_without_offload"], int):
            fail("with cap %d the run without offloading did not run out of memory" % cap)
        if c["oom_with_offload"] or len(c["losses_offload"]) != 3:
            fail("with cap %d the offloaded run did not train all 3 steps" % cap)
        if c["losses_offload"] != s["losses_offload"]:
            fail("the capped offloaded run's losses differ from the uncapped one's")
        if "ran out of device memory at step" not in proc.stdout:
            fail("the output does not say that the run without offloading ran out of memory")
        t = c["target_run"]
        if c["device_target"] != target or t is None or t["name"] != "target":
            fail("--device-target %d: the summary's device_target %r, target_run %r" % (target, c["device_target"], t))
        if t["oom_step"] is not None or t["losses"] != s["losses_offload"]:
            fail("with cap %d and target %d the targeted run did not train 3 steps with the same losses: %r"
                 % (cap, target, t["losses"]))
        if not t["peak_device_bytes"] <= cap:
            fail("the targeted run's peak %d is above the cap %d" % (t["peak_device_bytes"], cap))
        moved, everything = t["bytes_offloaded"], c["bytes_offloaded"]
        if not 0 < moved < everything or t["stats"]["passed_target"] == 0:
            fail("the targeted run moved %d bytes (offloading everything %d) and kept %d tensors on the device"
                 % (moved, everything, t["stats"]["passed_target"]))
        header = [line for line in proc.stdout.splitlines() if "no offload" in line and "offload (" in line]
        if len(header) != 1 or "offload (target)" not in header[0]:
            fail("the table has no column 'offload (target)': %r" % header)
        if "offload (target): trained all 3 steps under the cap" not in proc.stdout:
            fail("the output does not say that the targeted run trained under the cap")
    print("ok: cap %d bytes: no offload ran out at step %d, offload trained 3 steps; target %d: peak %d, moved %d of "
          "%d bytes" % (cap, c["oom_step_without_offload"], target, t["peak_device_bytes"], moved, everything))


def check_ranks(demo):
    with tempfile.TemporaryDirectory() as tmp:
        s, proc = summary(demo, ["--ranks", "2"], tmp, "ranks")
    line = ("data parallel (2 ranks, gradients averaged through c10d, offload_sim): losses bitwise equal with and "
            "without offloading on every rank; final parameters identical on every rank")
    if line not in proc.stdout.splitlines():
        fail("rank 0 did not print %r" % line)
    if s["losses_none"] != s["losses_offload"] or len(s["losses_offload"]) != 3:
        fail("rank 0's losses: %r vs %r" % (s["losses_none"], s["losses_offload"]))
    if not s["bytes_offloaded"] > 0:
        fail("nothing was offloaded")
    if proc.stdout.count("offload-demo ") != 1:
        fail("only rank 0 prints: %r" % proc.stdout)
    print("ok: 2 ranks, losses bitwise equal on every rank, same parameters, %d bytes offloaded on rank 0"
          % s["bytes_offloaded"])


def check_checkpoint(demo):
    base = TINY[:TINY.index("--layers")] + ["--layers", "4"] + TINY[TINY.index("--layers") + 2:] + ["--checkpoint"]
    with tempfile.TemporaryDirectory() as tmp:
        s, _ = summary(demo, [], tmp, "free", base)
        runs = {r["name"]: r for r in s["checkpoint_runs"]}
        if sorted(runs) != ["checkpoint", "checkpoint+streamed"]:
            fail("checkpoint_runs are %r" % sorted(runs))
        for r in runs.values():
            if r["losses"] != s["losses_none"] or not r["losses_bitwise_equal_to_none"]:
                fail("%s: losses %r differ from %r" % (r["name"], r["losses"], s["losses_none"]))
            if not r["peak_device_bytes"] < s["peak_device_bytes_none"]:
                fail("%s: peak %r not below %r" % (r["name"], r["peak_device_bytes"], s["peak_device_bytes_none"]))
        both = runs["checkpoint+streamed"]
        if not 0 < both["bytes_offloaded"] < s["bytes_offloaded"] / 4:
            fail("checkpoint + offload moved %r bytes, offload alone %r" % (both["bytes_offloaded"], s["bytes_offloaded"]))
        budget = both["stats"]["host_bytes_peak"]
        b, _ = summary(demo, ["--host-budget", str(budget)], tmp, "budget", base)
        both_b = [r for r in b["checkpoint_runs"] if r["name"] == "checkpoint+streamed"][0]
        if both_b["stats"]["passed_budget"] != 0 or b["stats_offload"]["passed_budget"] == 0:
            fail("with --host-budget %d: checkpoint + offload passed %r over budget, offload alone %r"
                 % (budget, both_b["stats"]["passed_budget"], b["stats_offload"]["passed_budget"]))
        if not both_b["peak_device_bytes"] < b["peak_device_bytes_offload"]:
            fail("with --host-budget %d: checkpoint + offload peak %r is not below offload's %r"
                 % (budget, both_b["peak_device_bytes"], b["peak_device_bytes_offload"]))
        # Plain offloading runs before the checkpointed runs and runs out of
        # device memory mid-forward: the runs after it start with nothing of
        # it held.
        cap = (both_b["peak_device_bytes"] + b["peak_device_bytes_offload"]) // 2
        c, proc = summary(demo, ["--host-budget", str(budget), "--device-memory-cap", str(cap)], tmp, "capped", base)
        both_c = [r for r in c["checkpoint_runs"] if r["name"] == "checkpoint+streamed"][0]
        if not c["oom_with_offload"]:
            fail("with cap %d and host budget %d plain offloading did not run out of memory" % (cap, budget))
        if both_c["oom_step"] is not None or both_c["losses"] != s["losses_none"]:
            fail("with cap %d checkpoint + offload did not train 3 steps with the same losses: %r" % (cap, both_c))
        if "checkpoint + offload (streamed): trained all 3 steps under the cap" not in proc.stdout:
            fail("the output does not say that checkpoint + offload trained under the cap")
    print("ok: checkpoint + offload moved %d bytes (offload alone %d); host budget %d, cap %d: offload ran out at "
          "step %d, checkpoint + offload trained 3 steps"
          % (both["bytes_offloaded"], s["bytes_offloaded"], budget, cap, c["oom_step_with_offload"]))


def check_bad_input(demo):
    # Every input with a fixed message is a row of docs/bad-input.md, checked
    # verbatim by tests/tools/bad_input.py. Here: the ones whose line depends on
    # the machine (the devices accepted on it).
    # (arguments, a word the one stderr line must contain)
    cases = [
        (["--device", "nosuchdevice"], "--device"),        # unavailable device
        (["--device", "xla"], "--device"),                 # a LibTorch device type absent here
    ]
    results = [(case, run_demo(demo, TINY + case[0])) for case in cases]
    for (args, word), proc in results:
        lines = proc.stderr.strip().splitlines()
        shown = " ".join(args)
        if proc.returncode != 2:
            fail("%s: exit status %d, expected 2 (stderr: %r)" % (shown, proc.returncode, proc.stderr))
        if len(lines) != 1:
            fail("%s: expected one line on stderr, got %d: %r" % (shown, len(lines), proc.stderr))
        if word not in lines[0]:
            fail("%s: the stderr line does not name %r: %r" % (shown, word, lines[0]))
        if proc.stdout.strip():
            fail("%s: printed on stdout before rejecting the input: %r" % (shown, proc.stdout))
        print("ok: %-40s -> %s" % (shown, lines[0]))


def main():
    checks = {"tiny": check_tiny, "lstm": lambda demo: check_tiny(demo, "lstm"), "cap-oom": check_cap_oom,
              "bad-input": check_bad_input, "ranks": check_ranks, "checkpoint": check_checkpoint}
    if len(sys.argv) != 3 or sys.argv[1] not in checks:
        print(__doc__)
        sys.exit(2)
    checks[sys.argv[1]](sys.argv[2])


if __name__ == "__main__":
    main()
