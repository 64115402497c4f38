#!/usr/bin/env python3
"""Runs a ThreadSanitizer-instrumented test command that races on purpose
and passes only if TSan reports a data race with at least one of the two
racing accesses in torch-offload's or the sim device's code.

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
OURS = ("src/sim/", "include/offload/", "policies/offload/", "src/engine.cpp", "src/hooks.cpp", "tests/faults.hpp")

run = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
out = run.stdout
report = out[out.find(RACE) :] if RACE in out else ""
summary = next((line for line in report.splitlines() if line.startswith("SUMMARY:")), "")
# The two racing accesses' stacks only: not the heap block's allocation
# stack, the mutexes or the threads' creation stacks that follow them.
accesses = report
for tail in ("\n  Location is", "\n  Mutex ", "\n  Thread T", "\n  As if synchronized", "\nSUMMARY:"):
    if tail in accesses:
        accesses = accesses[: accesses.find(tail)]
ok = run.returncode != 0 and bool(report) and any(part in accesses for part in OURS)
if ok:
    print(f"TSan reported the injected race (exit {run.returncode}): {summary}")
    print("1 passed, 0 failed")
else:
    why = "no ThreadSanitizer data race report" if not report else "neither racing access is in our sources"
    print(f"expected TSan to report the injected race: {why} (exit {run.returncode})")
    print(out[-4000:])
    print("0 passed, 1 failed")
sys.exit(0 if ok else 1)
