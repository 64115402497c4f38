#!/usr/bin/env python3
"""`offload::detail` is private: only the library (include/, policies/,
src/), the compile-time tests of its checks (tests/static/) and the unit
test of the plain-C++ planner (tests/test_planner.cpp, which has no public
header to test through) name it or include a header of
include/offload/detail/. The binding, the benchmarks,
the examples and the runtime tests use public headers only.

usage: detail_private.py SOURCE_ROOT

Scans every C++ source (.cpp, .hpp, .h, .inc) under the source root
outside those folders (and outside build folders). First proves it can see
a use (a line naming offload::detail must be reported). Prints
"N passed, N failed" (one per file scanned, plus the self-check).
"""

import os
import re
import sys

root = sys.argv[1]
ALLOWED = ("include", "policies", "src", os.path.join("tests", "static"))
ALLOWED_FILES = {os.path.join("tests", "test_planner.cpp")}
SKIP_DIRS = {"build", ".venv", ".git", "subprojects", "node_modules", "__pycache__"}
USE = re.compile(r"\boffload::detail\b|[<\"]offload/detail/")


def uses(text):
    """(line number, line) of each use of offload::detail in text."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if USE.search(line)]


passed = failed = 0
if (
    uses("auto s = offload::detail::transfer_of(e);\n#include <offload/detail/core.hpp>") == []
    or uses("auto s = offload::interface_of(m);") != []
):
    print("FAIL self-check: the pattern does not tell a use from a public name")
    failed += 1
else:
    passed += 1

for directory, dirs, files in os.walk(root):
    rel_dir = os.path.relpath(directory, root)
    # Hidden folders (.venv-thirdparty, .device-deps, ...) hold tools and third-party code, not ours.
    dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(("build", ".")))
    if rel_dir != "." and (rel_dir.split(os.sep)[0] in ALLOWED[:3] or rel_dir.startswith(ALLOWED[3])):
        dirs[:] = []
        continue
    for name in sorted(files):
        if not name.endswith((".cpp", ".hpp", ".h", ".inc")):
            continue
        path = os.path.join(directory, name)
        if os.path.relpath(path, root) in ALLOWED_FILES:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            found = uses(f.read())
        if found:
            failed += 1
            rel = os.path.relpath(path, root)
            for n, line in found:
                print(f"FAIL {rel}:{n}: names offload::detail (use a public header): {line}")
        else:
            passed += 1
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
