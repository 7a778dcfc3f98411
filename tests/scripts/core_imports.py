"""Imports the given modules of the package and fails if that brought in an engine or torch
(tests/repository/test_house.py: the pure core imports no engine and no torch).

Arguments: module names under ``vllm_scene_eplb``. Exits 1 naming the engine modules it found."""

from __future__ import annotations

import importlib
import sys


def main() -> None:
    for name in sys.argv[1:]:
        importlib.import_module(f"vllm_scene_eplb.{name}")
    bad = [m for m in ("torch", "vllm", "vllm_ascend") if m in sys.modules]
    assert not bad, bad


if __name__ == "__main__":
    main()
