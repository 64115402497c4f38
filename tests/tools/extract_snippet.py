#!/usr/bin/env python3
"""Writes the README's usage snippet (between '<!-- snippet:usage' and
'<!-- /snippet -->', without its #include lines) to a file that the tests
compile, so the README cannot drift from code that builds and runs."""

import sys

readme, out = sys.argv[1], sys.argv[2]
lines = open(readme, encoding="utf-8").read().splitlines()
start = next(i for i, line in enumerate(lines) if line.startswith("<!-- snippet:usage"))
end = next(i for i, line in enumerate(lines) if i > start and line.startswith("<!-- /snippet"))
body = [line for line in lines[start + 1 : end] if not line.startswith("```") and not line.startswith("#include")]
if not any(line.strip() for line in body):
    sys.exit("extract_snippet: the README usage snippet is empty")
with open(out, "w", encoding="utf-8") as f:
    f.write("// Generated from README.md by tests/tools/extract_snippet.py; do not edit.\n")
    f.write("\n".join(body) + "\n")
