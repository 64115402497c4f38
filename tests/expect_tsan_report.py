#!/usr/bin/env python3
"""Runs a ThreadSanitizer-instrumented test command that races on purpose
and passes only if TSan reports the race in torch-offload's or the sim
device's code.

It proves that the suppressions in tests/tsan.supp and the environment of
`scripts/test --sanitize=thread` still let a real race through: a clean
TSan run means something only if this one is not clean.

    expect_tsan_report.py COMMAND [ARGS...]

Prints "1 passed, 0 failed" or "0 passed, 1 failed" (counted by
scripts/count-tests.py) and, on failure, the tail of the output.
"""
import subprocess
import sys

RACE = "WARNING: ThreadSanitizer: data race"
OURS = ("src/sim/", "include/offload/", "policies/offload/", "src/engine.cpp")

run = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
out = run.stdout
report = out[out.find(RACE):] if RACE in out else ""
summary = next((line for line in report.splitlines() if line.startswith("SUMMARY:")), "")
ok = run.returncode != 0 and bool(report) and any(part in report for part in OURS)
if ok:
    print(f"TSan reported the injected race (exit {run.returncode}): {summary}")
    print("1 passed, 0 failed")
else:
    why = "no ThreadSanitizer data race report" if not report else "the report names none of our sources"
    print(f"expected TSan to report the injected race: {why} (exit {run.returncode})")
    print(out[-4000:])
    print("0 passed, 1 failed")
sys.exit(0 if ok else 1)
