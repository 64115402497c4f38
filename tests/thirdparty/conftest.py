# SPDX-License-Identifier: MIT
"""pytest setup for the third-party suite: run with the interpreter of
.venv-thirdparty (scripts/peer-venv: the project .venv's torch plus the
pinned packages of scripts/peer-pins.txt) and the package from the build
tree (PYTHONPATH). Offline: nothing is downloaded, models are built from
configs with random init and the tokenizer is built here. The sim device,
the memory-returns-to-baseline check and the closing line come from
tests/python/conftest.py (loaded below), so both suites run alike."""

import importlib.util
import os
import sys

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_name] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_PYTHON_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _PYTHON_TESTS)
_spec = importlib.util.spec_from_file_location("python_suite_conftest", os.path.join(_PYTHON_TESTS, "conftest.py"))
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)

pytest_runtest_makereport = _shared.pytest_runtest_makereport
memory_returns_to_baseline = _shared.memory_returns_to_baseline
pytest_terminal_summary = _shared.pytest_terminal_summary


def pytest_configure(config):
    # torchao (imported by transformers and torchtune) warns about its own import paths.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:torchao")
