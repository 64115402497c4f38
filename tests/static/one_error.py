#!/usr/bin/env python3
"""A policy that fails its concept stops the build with exactly one error,
naming the concept and the missing member; the twin one token away
compiles (so the harness is seen to tell the two apart).

usage: one_error.py SOURCE_ROOT GENERATED_INCLUDE LIBTORCH CUDA_INCLUDE COMPILER...

Compiles tests/static/one_error.cpp with -fsyntax-only once per CASE and
once per CASE with -DTWIN. Prints "N passed, N failed" (one per case).
"""

import concurrent.futures
import os
import re
import subprocess
import sys

root, generated, libtorch, cuda_include = sys.argv[1:5]
compiler = sys.argv[5:]
roots = ("include", "policies", os.path.join("src", "sim", "include"))
flags = (
    ["-std=c++20", "-fsyntax-only", "-fdiagnostics-color=never"]
    + [a for b in roots for a in ("-I", os.path.join(root, b))]
    + [
        "-I",
        generated,
        "-isystem",
        os.path.join(libtorch, "include"),
        "-isystem",
        os.path.join(libtorch, "include", "torch", "csrc", "api", "include"),
    ]
)
if cuda_include:
    flags += ["-isystem", cuda_include]
source = os.path.join(root, "tests", "static", "one_error.cpp")

# CASE: (what the one error must say, what no error may mention)
CASES = {
    1: ("offload::device_policy: it needs `static bool available()`", "Sync"),
    2: ("offload::storage_policy: it needs `static constexpr bool prefers_pinned`", "Sync"),
    3: ("State<Device> declares observes_steps and needs `void end_forward()`", "Streamed"),
    4: ("the Sync policy needs streams and events (needs_events) and the Device policy has none", "sync_policy_for"),
    5: ("`release` to be declared noexcept", "Streamed"),
    6: ("offload::storage_policy: it needs `static constexpr bool prefers_pinned`", "sync_policy_for"),
    7: (
        "has a step callback (end_forward, end_backward, on_unpack, on_shared, suspend, resume, add_stats or "
        "release) but does not declare `static constexpr bool observes_steps = true`",
        "Streamed",
    ),
    8: ("the Device policy's optional `numa_node` must be `static int numa_node(c10::DeviceIndex) noexcept`", "Sync"),
}


def compile_case(case, twin):
    cmd = compiler + flags + [f"-DCASE={case}"] + (["-DTWIN"] if twin else []) + [source]
    run = subprocess.run(cmd, capture_output=True, text=True)
    return run.returncode, run.stderr


def check(case):
    want, unwanted = CASES[case]
    rc, err = compile_case(case, twin=False)
    errors = [line for line in err.splitlines() if re.search(r"\berror:", line)]
    problems = []
    if rc == 0:
        problems.append("compiled, but must not")
    if len(errors) != 1:
        problems.append(f"{len(errors)} errors, want exactly 1")
    if not any(want in e for e in errors):
        problems.append(f"no error says {want!r}")
    if any(unwanted in e for e in errors):
        problems.append(f"an error mentions {unwanted!r}")
    twin_rc, twin_err = compile_case(case, twin=True)
    if twin_rc != 0:
        problems.append("its twin does not compile:\n" + twin_err[-2000:])
    return case, problems, "\n".join(errors)[:3000]


failed = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    for case, problems, errors in pool.map(check, sorted(CASES)):
        if problems:
            failed += 1
            print(f"FAIL case {case}: " + "; ".join(problems) + "\n" + errors)
        else:
            print(f"ok   case {case}: {CASES[case][0]}")
print(f"{len(CASES) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
