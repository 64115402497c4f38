#!/usr/bin/env python3
"""Meson tests `install_layout`, `install_pkgconfig`, `install_cmake` and
`install_cmake_find_torch`: install the already built project into a
temporary staging directory (`meson install --destdir --no-rebuild`), check
the layout, and build tests/consumer/main.cpp against the installed tree.

  --mode layout            only the layout: headers of both include roots
                           merged under <includedir>/offload/ with config.hpp,
                           both libraries, the .pc files, the CMake config
  --mode pkgconfig         c++ -std=c++20 main.cpp $(pkg-config --cflags --libs torch-offload-sim)
  --mode cmake             find_package(torch-offload) alone (its own LibTorch target)
  --mode cmake-find-torch  find_package(Torch) then find_package(torch-offload);
                           exits 77 (skipped) when find_package(Torch) itself
                           cannot configure (a CUDA LibTorch without the CUDA
                           toolkit), which is LibTorch's limitation, not ours

Every mode except layout runs the program (one training step on sim, bitwise
against no offloading). The staging tree has the build's prefix under
--destdir, so pkg-config is told the prefix with --define-variable; the CMake
config finds its prefix from its own location.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
consumer_main = os.path.join(here, "..", "consumer", "main.cpp")
SKIP = 77


def run(cmd, **kw):
    print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def install(args, tmp):
    """Installs into tmp/stage; returns (staged prefix, staged libdir, staged includedir)."""
    stage = os.path.join(tmp, "stage")
    run([args.meson, "install", "-C", args.build_root, "--destdir", stage, "--no-rebuild", "--quiet"])
    opts = {
        o["name"]: o["value"]
        for o in json.loads(
            run([args.meson, "introspect", "--buildoptions", args.build_root], capture_output=True, text=True).stdout
        )
    }

    def staged(p):
        return stage + (p if os.path.isabs(p) else os.path.join(opts["prefix"], p))

    return staged(opts["prefix"]), staged(opts["libdir"]), staged(opts["includedir"])


def check_layout(prefix, libdir, includedir):
    want = [
        os.path.join(includedir, "offload", f)
        for f in (
            "offload.hpp",
            "config.hpp",
            "fwd.hpp",
            "dispatch.hpp",
            "detail/core.hpp",  # include/offload
            "sim.hpp",  # src/sim/include/offload
            "builtin.hpp",  # policies/offload
            "device/cuda.hpp",
            "device/sim.hpp",
            "device/generic.hpp",
            "storage/host.hpp",  # policies/offload
            "sync/blocking.hpp",
            "sync/streamed.hpp",
        )
    ]
    want += [
        os.path.join(libdir, f)
        for f in (
            "liboffload.so",
            "liboffload_sim.so",
            "pkgconfig/torch-offload.pc",
            "pkgconfig/torch-offload-sim.pc",
            "cmake/torch-offload/torch-offloadConfig.cmake",
            "cmake/torch-offload/torch-offloadConfigVersion.cmake",
        )
    ]
    missing = [p for p in want if not os.path.isfile(p)]
    stray = [p for p in ("meson.build", "config.hpp.in") if os.path.exists(os.path.join(includedir, "offload", p))]
    for p in missing:
        print("install: FAIL: missing", os.path.relpath(p, prefix), file=sys.stderr)
    for p in stray:
        print("install: FAIL: build file installed: include/offload/" + p, file=sys.stderr)
    n = sum(len(files) for _, _, files in os.walk(os.path.join(includedir, "offload")))
    print(f"install: {n} headers under include/offload/; {len(want) - len(missing)}/{len(want)} expected files")
    return not missing and not stray


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", required=True, choices=["layout", "pkgconfig", "cmake", "cmake-find-torch"])
    ap.add_argument("--build-root", required=True, help="the built torch-offload build directory")
    ap.add_argument("--libtorch", required=True, help="LibTorch prefix (for <torch>/share/cmake)")
    ap.add_argument("--meson", default="meson")
    ap.add_argument("--cxx", default="c++", help="C++ compiler command (one shell-quoted string)")
    ap.add_argument("--cmake", default="cmake")
    ap.add_argument("--pkg-config", default="pkg-config")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    cxx = shlex.split(args.cxx)
    # Meson reports a compiler launcher (ccache, sccache) as the first word of
    # the compiler command; CMake takes it separately.
    launcher = []
    if len(cxx) > 1 and os.path.basename(cxx[0]) in ("ccache", "sccache"):
        launcher = ["-DCMAKE_CXX_COMPILER_LAUNCHER=" + cxx[0]]

    tmp = tempfile.mkdtemp(prefix="offload-install-")
    status = 1
    try:
        prefix, libdir, includedir = install(args, tmp)
        if not check_layout(prefix, libdir, includedir):
            return 1
        if args.mode == "layout":
            status = 0
            return status
        exe = os.path.join(tmp, "consumer")
        t0 = time.monotonic()
        if args.mode == "pkgconfig":
            env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(libdir, "pkgconfig"))
            flags = run(
                [args.pkg_config, "--define-variable=prefix=" + prefix, "--cflags", "--libs", "torch-offload-sim"],
                env=env,
                capture_output=True,
                text=True,
            ).stdout.split()
            # The staged libdir is no system directory: tell the loader (an
            # installed prefix in the loader's path needs no rpath).
            run(cxx + ["-std=c++20", consumer_main, "-o", exe] + flags + ["-Wl,-rpath," + libdir])
        else:
            src, build = os.path.join(tmp, "src"), os.path.join(tmp, "build")
            os.makedirs(src)
            shutil.copy(os.path.join(here, "CMakeLists.txt"), src)
            shutil.copy(consumer_main, src)
            find_torch = args.mode == "cmake-find-torch"
            configure = [
                args.cmake,
                "-S",
                src,
                "-B",
                build,
                "-DCMAKE_BUILD_TYPE=",  # no -O: quicker
                "-DCMAKE_CXX_COMPILER=" + cxx[len(launcher)],
                *launcher,
                "-DCMAKE_PREFIX_PATH=" + prefix + ";" + os.path.join(args.libtorch, "share", "cmake"),
                "-DCONSUMER_FIND_TORCH=" + ("ON" if find_torch else "OFF"),
            ]
            print("+", " ".join(shlex.quote(c) for c in configure), flush=True)
            done = subprocess.run(configure, capture_output=True, text=True)
            sys.stdout.write(done.stdout[-4000:])
            sys.stderr.write(done.stderr[-8000:])
            if done.returncode != 0:
                if find_torch and "uses CUDA but I cannot find the CUDA libraries" in " ".join(done.stderr.split()):
                    print(
                        "install_cmake_find_torch: SKIP: find_package(Torch) needs the CUDA toolkit for this "
                        "CUDA build of LibTorch; find_package(torch-offload) alone is tested by install_cmake"
                    )
                    status = SKIP
                    return status
                return 1
            # Which LibTorch target torch-offload::offload took (see its config).
            want = "torch" if find_torch else "torch-offload::libtorch"
            links = [line.split("links: ", 1)[1].split(";") for line in done.stdout.splitlines() if "links: " in line]
            if not links or links[0][0] != want:
                print(f"install: FAIL: torch-offload::offload should link {want} first, links {links}", file=sys.stderr)
                return 1
            run([args.cmake, "--build", build, "--", "-j2"])
            exe = os.path.join(build, "consumer")
        t1 = time.monotonic()
        # `meson test` puts the build directory on LD_LIBRARY_PATH, which
        # would outrank the installed libraries: run without it, and check
        # that the loader resolves torch-offload to the installed tree.
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        ldd = run(["ldd", exe], env=env, capture_output=True, text=True).stdout
        resolved = [
            line.split("=>")[1].split()[0]
            for line in ldd.splitlines()
            if line.strip().startswith(("liboffload.so", "liboffload_sim.so")) and "=>" in line
        ]
        print("resolved:", resolved)
        if len(resolved) != 2 or not all(os.path.realpath(r).startswith(os.path.realpath(libdir)) for r in resolved):
            print(f"install: FAIL: liboffload*.so do not resolve to the installed {libdir}:\n{ldd}", file=sys.stderr)
            return 1
        run([exe], env=env)
        print(f"install_{args.mode.replace('-', '_')}: build {t1 - t0:.0f} s, run {time.monotonic() - t1:.1f} s")
        status = 0
    except subprocess.CalledProcessError as e:
        print(f"install_{args.mode.replace('-', '_')}: FAIL: {e}", file=sys.stderr)
        status = 1
    finally:
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
