"""vLLM-Ascend's own released Python code, fetched from the package registry and cached between runs."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import re
import tarfile
import urllib.request
from pathlib import Path

VERSION = "0.23.0.post1"
SDIST = f"vllm_ascend-{VERSION}.tar.gz"
SHA256 = "a3b9f4a5dd7aa50c37e03d1f35937c4ae5aeacc49b734cac74d59ce5757738e1"
MEMBERS = (
    "vllm_ascend/eplb/core/eplb_utils.py",
    # enough of the package to import it by its own name (these files import nothing heavy)
    "vllm_ascend/__init__.py",
    "vllm_ascend/logger.py",
    "vllm_ascend/eplb/__init__.py",
    "vllm_ascend/eplb/core/__init__.py",
    "vllm_ascend/ascend_config.py",
)


def cache_dir() -> Path:
    return Path(os.environ.get("SCENE_EPLB_CACHE", Path.home() / ".cache" / "scene-eplb")) / f"vllm-ascend-{VERSION}"


def fetch() -> Path:
    """Extract the needed files of the sdist into the cache (download once, SHA-256 checked)."""
    root = cache_dir()
    if all((root / m).is_file() for m in MEMBERS):
        return root
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    html = urllib.request.urlopen(f"{index}/vllm-ascend/", timeout=60).read().decode()
    link = next(m for m in re.findall(r'href="([^"]+)"', html) if SDIST in m)
    url = link if "://" in link else urllib.request.urljoin(f"{index}/vllm-ascend/", link)
    data = urllib.request.urlopen(url, timeout=300).read()
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise RuntimeError(f"{SDIST}: SHA-256 mismatch")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in MEMBERS:
            src = tar.extractfile(f"vllm_ascend-{VERSION}/{m}")
            (root / m).parent.mkdir(parents=True, exist_ok=True)
            (root / m).write_bytes(src.read())
    return root


def load_eplb_utils():
    """Import vllm_ascend/eplb/core/eplb_utils.py (needs torch and vllm, both CPU-importable)."""
    path = fetch() / MEMBERS[0]
    spec = importlib.util.spec_from_file_location("vllm_ascend_eplb_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
