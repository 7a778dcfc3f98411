"""Lint, format and types, as configured in pyproject.toml: ruff (lint and format) over the package,
the tests, the benchmarks and the scripts, mypy over the package and the scripts the tests run
(``tests/scripts``). The tools come with the test extra."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["vllm_scene_eplb", "tests", "benchmarks", "scripts"]


def _tool(name: str) -> str:
    found = shutil.which(name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if not found:
        pytest.fail(f"{name} not found: it comes with the test extra; run scripts/setup.sh")
    return found


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, cwd=REPO, timeout=600)


def test_ruff_lint_is_clean():
    res = _run(_tool("ruff"), "check", "--output-format", "concise", *SOURCES)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_ruff_format_is_clean():
    res = _run(_tool("ruff"), "format", "--check", *SOURCES)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_mypy_is_clean():
    res = _run(_tool("mypy"))  # files and settings from pyproject.toml
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
