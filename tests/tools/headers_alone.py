#!/usr/bin/env python3
"""Every public header compiles on its own (no include-order dependency).

usage: headers_alone.py SOURCE_ROOT GENERATED_INCLUDE LIBTORCH CUDA_INCLUDE COMPILER...

Compiles `#include <offload/...>` alone, -fsyntax-only, for each header
under include/offload/, policies/offload/ and the sim library's
src/sim/include/offload/; device/cuda.hpp needs no CUDA header by design.
Prints "N passed, N failed".
"""

import concurrent.futures
import os
import subprocess
import sys
import tempfile

root, generated, libtorch, cuda_include = sys.argv[1:5]
compiler = sys.argv[5:]
headers = []
roots = ("include", "policies", os.path.join("src", "sim", "include"))
for base in roots:
    top = os.path.join(root, base)
    for dirpath, _, files in os.walk(top):
        for f in sorted(files):
            if f.endswith(".hpp"):
                headers.append(os.path.relpath(os.path.join(dirpath, f), top))
flags = (
    ["-std=c++20", "-fsyntax-only"]
    + [a for base in roots for a in ("-I", os.path.join(root, base))]
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


def check(header):
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as tu:
        tu.write(f"#include <{header}>\n")
    try:
        run = subprocess.run(compiler + flags + [tu.name], capture_output=True, text=True)
        return header, run.returncode, run.stderr
    finally:
        os.unlink(tu.name)


failed = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    for header, rc, err in pool.map(check, headers):
        if rc != 0:
            failed += 1
            print(f"FAIL {header}:\n{err[:2000]}")
print(f"{len(headers) - failed} passed, {failed} failed")
sys.exit(1 if failed or not headers else 0)
