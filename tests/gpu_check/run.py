#!/usr/bin/env python3
"""Meson test `gpu_check_offline`: the offline path of scripts/gpu-check,
on a machine without a GPU.

1. `scripts/gpu-check` and `scripts/gpu-check --offline` exit 3 with one
   line saying there is no CUDA device (skipped where a GPU is visible).
2. Its other one-line refusals, exit 3: a LibTorch older than 2.9, one
   without CUDA, no prepared folder; bad usage exits 2.
3. `scripts/device-deps --headers-only` fills a folder, and
   `scripts/gpu-check --build-only --deps` builds the library with
   device::Cuda, the compile-time tests of the dispatcher (Boost.Hana) and
   the doctest main against the LibTorch given by --libtorch. Proof that
   the folder was the only source of those headers: ninja's record of every
   header each object read (`ninja -t deps`) holds Boost, doctest, CLI11 and
   nlohmann headers only from the folder, and some of each kind it must use.
   Taking one Hana header out of the folder must make that check fail.
   Proof that no registry was used: apt-get, apt, pip, pip3 and sudo are
   stubs on PATH that record any call (none may happen), PIP_NO_INDEX is set.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
HEADER_DIRS = ("boost", "doctest", "CLI", "nlohmann")
# The smallest build that reads Boost.Hana and doctest: liboffload (engine,
# device::Cuda), the dispatcher's compile-time tests, the doctest main.
TARGETS = [
    "liboffload.so",
    "tests/liboffload_static_tests.a.p/static_devices.cpp.o",
    "tests/offload_tests.p/main.cpp.o",
]

failures = []


def check(ok, what):
    print(("ok:   " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(cmd, env, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def one_line_exit(script, args, env, status, needle):
    done = run([script] + args, env)
    lines = done.stdout.splitlines()
    check(
        done.returncode == status and len(lines) == 1 and needle in lines[0],
        f"gpu-check {' '.join(args)}: exit {status}, one line with '{needle}' "
        f"(got exit {done.returncode}: {done.stdout.strip()!r})",
    )


def fake_libtorch(tmp, name, minor, cuda):
    d = os.path.join(tmp, name)
    os.makedirs(os.path.join(d, "include", "torch", "headeronly"))
    os.makedirs(os.path.join(d, "lib"))
    with open(os.path.join(d, "include", "torch", "headeronly", "version.h"), "w") as f:
        f.write(f"#define TORCH_VERSION_MAJOR 2\n#define TORCH_VERSION_MINOR {minor}\n")
    if cuda:
        open(os.path.join(d, "lib", "libtorch_cuda.so"), "w").close()
    return d


def header_origins(ninja, build, include):
    """From ninja's record of the headers each object read: how many of each
    kind (HEADER_DIRS) came from `include`, and the set of those that did not."""
    record = subprocess.run([ninja, "-C", build, "-t", "deps"], capture_output=True, text=True).stdout
    inside, outside = {}, set()
    for line in record.splitlines():
        path = line.strip()
        if not path or ": #deps" in line:
            continue
        full = os.path.realpath(os.path.join(build, path))
        kind = next((d for d in HEADER_DIRS if d in full.split(os.sep)), None)
        if kind is None:
            continue
        if full.startswith(include + os.sep):
            inside[kind] = inside.get(kind, 0) + 1
        else:
            outside.add(full)
    for p in sorted(outside)[:20]:
        print("  read from outside the folder:", p)
    return inside, outside


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source-root", required=True)
    ap.add_argument("--libtorch", required=True, help="a CUDA LibTorch (the pip wheel's torch/ directory)")
    ap.add_argument("--meson", required=True)
    ap.add_argument("--ninja", required=True)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    gpu_check = os.path.join(args.source_root, "scripts", "gpu-check")
    device_deps = os.path.join(args.source_root, "scripts", "device-deps")

    tmp = tempfile.mkdtemp(prefix="offload-gpu-check-")
    try:
        stubs = os.path.join(tmp, "stubs")
        calls = os.path.join(tmp, "registry-calls")
        os.makedirs(stubs)
        for tool in ("apt-get", "apt", "pip", "pip3", "sudo"):
            with open(os.path.join(stubs, tool), "w") as f:
                f.write(f'#!/bin/sh\necho "{tool} $*" >>"{calls}"\nexit 1\n')
            os.chmod(os.path.join(stubs, tool), 0o755)
        tools = sorted({os.path.dirname(os.path.abspath(p)) for p in (args.meson, args.ninja)})
        env = {k: v for k, v in os.environ.items() if k not in ("OUT", "LD_LIBRARY_PATH")}
        env.update(PATH=os.pathsep.join([stubs] + tools + [os.environ.get("PATH", "")]), PIP_NO_INDEX="1")

        # 1. no GPU: one line, exit 3
        if (
            shutil.which("nvidia-smi", path=env["PATH"])
            and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
        ):
            print("skip: a GPU is visible here; the no-GPU exit is not checked")
        else:
            for extra in ([], ["--offline"]):
                one_line_exit(gpu_check, extra, env, 3, "no CUDA device")

        # 2. the other refusals (no GPU needed with --build-only)
        deps = os.path.join(tmp, "deps")
        old = fake_libtorch(tmp, "torch-2.8", 8, cuda=True)
        cpu = fake_libtorch(tmp, "torch-cpu", 11, cuda=False)
        build = os.path.join(tmp, "build")
        one_line_exit(
            gpu_check,
            ["--build-only", "--deps", os.path.join(tmp, "nowhere"), "--libtorch", args.libtorch],
            env,
            3,
            "no prepared header folder",
        )
        t0 = time.monotonic()
        done = run([device_deps, "--headers-only", deps], env)
        print(done.stdout, end="")
        check(done.returncode == 0, f"device-deps --headers-only fills {deps} ({time.monotonic() - t0:.0f} s)")
        one_line_exit(gpu_check, ["--build-only", "--deps", deps, "--libtorch", old], env, 3, "2.9 or newer")
        one_line_exit(gpu_check, ["--build-only", "--deps", deps, "--libtorch", cpu], env, 3, "has no CUDA")
        one_line_exit(gpu_check, ["--frobnicate"], env, 2, "unknown argument '--frobnicate'")

        # 3. the offline build, and where its headers came from
        t0 = time.monotonic()
        done = run(
            [
                gpu_check,
                "--build-only",
                "--deps",
                deps,
                "--libtorch",
                args.libtorch,
                "--build",
                build,
                "--targets",
                ",".join(TARGETS),
            ],
            env,
        )
        print(done.stdout[-6000:], end="")
        check(done.returncode == 0, f"offline build of {', '.join(TARGETS)} ({time.monotonic() - t0:.0f} s)")
        include = os.path.realpath(os.path.join(deps, "include"))
        if done.returncode == 0:
            inside, outside = header_origins(args.ninja, build, include)
            check(
                not outside, f"no Boost/doctest/CLI11/nlohmann header read from outside {include} ({len(outside)} were)"
            )
            check(
                inside.get("boost", 0) > 0 and inside.get("doctest", 0) > 0,
                f"Boost.Hana and doctest headers read from the folder: {inside}",
            )
            with open(os.path.join(build, "compile_commands.json")) as f:
                check("-isystem " + include in f.read(), f"compile commands pass -isystem {include}")
            # The check can fail: a header missing from the folder is read
            # from the system's copy (or the compile fails where there is none).
            os.remove(os.path.join(include, "boost", "hana", "tuple.hpp"))
            again = run([args.ninja, "-C", build, TARGETS[1]], env)
            inside, outside = header_origins(args.ninja, build, include)
            check(
                again.returncode != 0 or any(p.endswith("/boost/hana/tuple.hpp") for p in outside),
                "with boost/hana/tuple.hpp taken out of the folder, the check reports it read from elsewhere "
                f"(build exit {again.returncode}, outside: {sorted(outside)})",
            )
        check(
            not os.path.exists(calls),
            "no registry client called" + ("" if not os.path.exists(calls) else ": " + open(calls).read().strip()),
        )
    finally:
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"gpu_check_offline: {'FAIL: ' + '; '.join(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
