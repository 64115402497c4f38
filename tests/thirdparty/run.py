#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Runs the third-party suite (tests/thirdparty/) with .venv-thirdparty's
interpreter against the package in the build tree:

    run.py SOURCE_ROOT BUILD_ROOT

scripts/setup installs .venv-thirdparty (scripts/peer-venv, pinned, once);
this only checks it, with no network. When it is missing or incomplete the
suite fails with the reason and the closing line "0 passed, 1 failed"; it
is never skipped."""

import os
import subprocess
import sys

root, build = sys.argv[1], sys.argv[2]
venv = os.path.join(root, ".venv-thirdparty")
check = subprocess.run([os.path.join(root, "scripts", "peer-venv"), venv, "--check"], capture_output=True, text=True)
if check.returncode != 0:
    print(f"thirdparty: the suite's environment is not usable: {(check.stdout + check.stderr).strip()}")
    print("0 passed, 1 failed")
    sys.exit(1)
env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), PYTHONDONTWRITEBYTECODE="1")
python = os.path.join(venv, "bin", "python3")
os.execve(
    python, [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(root, "tests", "thirdparty")], env
)
