#!/usr/bin/env python3
"""Every C++ code block of the documentation compiles.

usage: doc_blocks.py SOURCE_ROOT GENERATED_INCLUDE LIBTORCH CUDA_INCLUDE COMPILER...

Scans README.md, docs/*.md and docs/policies/*.md for ```cpp blocks. Each
must be preceded (within three lines) by a marker saying how it is compiled:

  <!-- compiled: declarations -->  at namespace scope, as written
  <!-- compiled: statements -->    as the body of a function that has a
                                   user's usual names in scope: `model`
                                   (model->parameters(), model->buffers(), model->loss(inputs,
                                   targets)), `optimizer` (zero_grad, step),
                                   `inputs`, `targets`, `steps`, `options`

A block without a marker fails the test. The blocks of one file make one
translation unit, in order (a block may use what an earlier one declared),
with their own #include lines hoisted to the top and nothing else included,
so an include a block forgot is an error. Compiled with -fsyntax-only (which
still instantiates templates and evaluates static_asserts). Some blocks are
also compiled and run by other tests (<!-- snippet:... --> markers).
Prints "N passed, N failed" (one per file).
"""

import concurrent.futures
import glob
import os
import re
import subprocess
import sys
import tempfile

root, generated, libtorch, cuda_include = sys.argv[1:5]
compiler = sys.argv[5:]
roots = ("include", "policies", os.path.join("src", "sim", "include"))
flags = (
    ["-std=c++20", "-fsyntax-only", "-Wall"]
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

# What a statements block may use: stand-ins for a user's model and optimizer.
CONTEXT = """
#include <cstdint>
#include <vector>
#include <ATen/core/Tensor.h>
namespace torch { using at::Tensor; }
namespace doc_context {
struct Model {
  std::vector<at::Tensor> parameters();
  std::vector<at::Tensor> buffers();
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets);
};
struct Optimizer {
  void zero_grad();
  void step();
};
}  // namespace doc_context
"""
PARAMS = (
    "[[maybe_unused]] doc_context::Model* model, [[maybe_unused]] doc_context::Optimizer& optimizer, "
    "[[maybe_unused]] const at::Tensor& inputs, [[maybe_unused]] const at::Tensor& targets, "
    "[[maybe_unused]] int steps, [[maybe_unused]] const offload::Options& options"
)
MARKER = re.compile(r"<!-- compiled: (declarations|statements) -->")


def blocks(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```cpp":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            kind = None
            for k in range(max(0, i - 3), i):
                m = MARKER.search(lines[k])
                if m:
                    kind = m.group(1)
            yield i + 1, kind, lines[i + 1 : end]
            i = end
        i += 1


def translation_unit(path):
    includes, body, unmarked = [], [], []
    for n, (line, kind, code) in enumerate(blocks(path)):
        if kind is None:
            unmarked.append(line)
            continue
        includes += [c for c in code if c.startswith("#include")]
        code = [c for c in code if not c.startswith("#include")]
        body.append(f'#line {line + 1} "{os.path.relpath(path, root)}"')
        if kind == "declarations":
            body += code
        else:
            body += [f"void doc_block_{n}({PARAMS}) {{"] + code + ["}"]
    if any(k == "statements" for _, k, _ in blocks(path)):
        includes = ["#include <offload/options.hpp>"] + includes
        head = [CONTEXT]
    else:
        head = []
    return "\n".join(includes + head + body) + "\n", unmarked


def check(path):
    text, unmarked = translation_unit(path)
    if unmarked:
        return path, 1, f"```cpp blocks without a <!-- compiled: ... --> marker at lines {unmarked}"
    if "doc_block" not in text and "#line" not in text:
        return path, 0, ""
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as tu:
        tu.write(text)
    try:
        run = subprocess.run(compiler + flags + [tu.name], capture_output=True, text=True)
        return path, run.returncode, run.stderr
    finally:
        os.unlink(tu.name)


docs = (
    [os.path.join(root, "README.md")]
    + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    + sorted(glob.glob(os.path.join(root, "docs", "policies", "*.md")))
)
docs = [d for d in docs if any(True for _ in blocks(d))]
failed = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    for path, rc, err in pool.map(check, docs):
        name = os.path.relpath(path, root)
        if rc != 0:
            failed += 1
            print(f"FAIL {name}:\n{err[:3000]}")
        else:
            print(f"ok   {name}")
print(f"{len(docs) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
