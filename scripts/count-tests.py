#!/usr/bin/env python3
"""Counts test cases from a Meson test log and prints 'N passed, N failed'.

A doctest executable contributes its own test-case counts (its summary
line), and so does a table-driven script that ends with "N passed, N
failed"; any other Meson test counts as one case, passed or failed by its
result. A doctest run that crashed before its summary counts one failure.
"""

import json
import re
import sys

SUMMARY = re.compile(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed")
PLAIN = re.compile(r"^(\d+) passed, (\d+) failed", re.M)  # table-driven scripts (tests/tools/bad_input.py)

passed = failed = 0
with open(sys.argv[1], encoding="utf-8") as log:
    for line in log:
        line = line.strip()
        if not line:
            continue
        test = json.loads(line)
        out = test.get("stdout", "") or ""
        found = [(0,) + m for m in PLAIN.findall(out)] or SUMMARY.findall(out)
        if found:
            _, p, f = (int(x) for x in found[-1])
            passed += p
            failed += f
            if test.get("result") != "OK" and f == 0:
                failed += 1  # exited non-zero despite a clean summary
        elif test.get("result") in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif test.get("result") == "SKIP":
            pass
        else:
            failed += 1
print(f"{passed} passed, {failed} failed")
