#!/usr/bin/env python3
"""Checks docs/bad-input.md row by row.

usage: bad_input.py DOC DEMO_EXECUTABLE TEST_CORE_CPP

Demo rows: runs the demo with the row's arguments; requires exit status 2,
nothing on stdout and exactly the documented line on stderr.
Options rows: requires the documented message verbatim in the Options
table of tests/test_core.cpp, which checks it against Options::validate().
"""

import os
import re
import shlex
import subprocess
import sys
import tempfile

doc, demo, test_core = sys.argv[1:4]
text = open(doc, encoding="utf-8").read()
core = open(test_core, encoding="utf-8").read()
section = None
failures = []
checked = 0
with tempfile.TemporaryDirectory() as tmp:
    empty = os.path.join(tmp, "empty.txt")
    short = os.path.join(tmp, "short.txt")
    open(empty, "w").close()
    with open(short, "w") as f:
        f.write("x")
    for line in text.splitlines():
        if line.startswith("## "):
            section = "options" if "`offload::Options`" in line else "demo" if "Demo" in line else None
            continue
        cells = re.findall(r"`([^`]*)`", line) if line.startswith("| `") else []
        if not cells:
            continue
        if section == "options":
            message = cells[-1]
            checked += 1
            if f'"{message}"' not in core:
                failures.append(f"Options row not tested in test_core.cpp: {message}")
        elif section == "demo":
            args, expected = cells[0], cells[1]
            expected = expected.replace("{empty}", empty).replace("{short}", short)
            argv = [a.replace("{empty}", empty).replace("{short}", short) for a in shlex.split(args)]
            run = subprocess.run([demo] + argv, capture_output=True, text=True, timeout=120)
            checked += 1
            err = run.stderr.strip().splitlines()
            if run.returncode != 2 or run.stdout.strip() or err != [expected]:
                failures.append(
                    f"demo {args!r}: exit {run.returncode}, stderr {run.stderr.strip()!r}, "
                    f"expected exit 2 and {expected!r}"
                )
for f in failures:
    print("FAIL:", f)
print(f"{checked - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures or checked == 0 else 0)
