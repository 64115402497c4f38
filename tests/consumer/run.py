#!/usr/bin/env python3
"""Meson test `consumer_subproject`: builds tests/consumer/ (a separate Meson
project) with torch-offload as its subproject and runs the program.

In a temporary directory: copies meson.build and main.cpp of tests/consumer/,
makes subprojects/torch-offload a symlink to this repository (nothing of the
library is copied), runs `meson setup` with -Dtorch-offload:libtorch=PREFIX
(the top project's LibTorch), ninja, and the program. Then checks what the
subproject promises its parent:
  - it builds no tests, examples or benchmarks (only liboffload, liboffload_sim);
  - it adds no warning flags to its dependents (the consumer compiles main.cpp
    with warning_level=0: no -W option may appear in that command);
  - it installs nothing (`meson introspect --installed` is empty).
Exit status 0 when all hold; the temporary directory is removed unless --keep.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source-root", required=True, help="the torch-offload repository")
    ap.add_argument("--libtorch", required=True, help="LibTorch prefix the top project uses")
    ap.add_argument(
        "--cuda",
        default="auto",
        choices=["enabled", "disabled", "auto"],
        help="torch-offload's cuda feature for the subproject (default auto)",
    )
    ap.add_argument("--meson", default="meson")
    ap.add_argument("--ninja", default="ninja")
    ap.add_argument("--jobs", default="2")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="offload-consumer-")
    ok = False
    try:
        src, build = os.path.join(tmp, "src"), os.path.join(tmp, "build")
        os.makedirs(os.path.join(src, "subprojects"))
        for name in ("meson.build", "main.cpp"):
            shutil.copy(os.path.join(here, name), src)
        os.symlink(os.path.abspath(args.source_root), os.path.join(src, "subprojects", "torch-offload"))

        t0 = time.monotonic()
        run(
            [
                args.meson,
                "setup",
                build,
                src,
                "--buildtype=plain",
                "-Dtorch-offload:libtorch=" + args.libtorch,
                "-Dtorch-offload:cuda=" + args.cuda,
            ]
        )
        run([args.ninja, "-C", build, "-j", args.jobs])
        t1 = time.monotonic()
        run([os.path.join(build, "consumer")])
        t2 = time.monotonic()

        failures = []

        def intro(what):
            return json.loads(
                subprocess.run(
                    [args.meson, "introspect", what, build], check=True, capture_output=True, text=True
                ).stdout
            )

        targets = intro("--targets")
        sub = sorted(t["name"] for t in targets if t.get("subproject") == "torch-offload")
        if sub != ["offload", "offload_sim"]:
            failures.append(f"the subproject builds {sub}; expected only ['offload', 'offload_sim']")
        installed = intro("--installed")
        if installed:
            failures.append(f"the subproject installs {sorted(installed.values())}; expected nothing")
        commands = json.load(open(os.path.join(build, "compile_commands.json")))
        mine = [c for c in commands if c["file"].endswith("main.cpp") and "subprojects" not in c["file"]]
        if len(mine) != 1:
            failures.append(f"expected one compile command for main.cpp, found {len(mine)}")
        for c in mine:
            flags = c.get("arguments") or c["command"].split()
            warns = [f for f in flags if f.startswith("-W") and not f.startswith(("-Wl,", "-Wp,"))]
            if warns:
                failures.append(f"warning flags leak into the consumer: {warns}")
        for f in failures:
            print("consumer_subproject: FAIL:", f, file=sys.stderr)
        print(
            f"consumer_subproject: setup+build {t1 - t0:.0f} s, run {t2 - t1:.1f} s; "
            f"subproject targets {sub}; installs nothing: {not installed}",
            flush=True,
        )
        ok = not failures
    finally:
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
