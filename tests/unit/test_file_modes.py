"""Every file the CLI writes is readable by a server of another user: its mode is what the umask
gives a plain ``open`` (0644 under 022, 0640 under 027), though it is written atomically through a
temporary file (which ``mkstemp`` makes 0600)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vllm_scene_eplb.fileio import current_umask
from vllm_scene_eplb.formats import write_counts
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.rig.tiny_deepseek_v4 import TinyDeepseekV4Spec, make_tiny_deepseek_v4

from ..conftest import skewed_counts


def _cli_under(umask: int, *args) -> subprocess.CompletedProcess:
    """`scene-eplb ARGS` in a process whose umask is ``umask``."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_scene_eplb.cli", *map(str, args)],
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.umask(umask),
    )


def _written(tmp: Path, umask: int) -> list[Path]:
    """Run every writing command once under ``umask``; the files they wrote."""
    counts = tmp / "counts.npz"
    write_counts(Counts(skewed_counts(4, 3, 16, seed=1)), counts)
    model = make_tiny_deepseek_v4(tmp / "v4", TinyDeepseekV4Spec())
    (tmp / "ids.json").write_text("[[1, 2, 3, 4, 5]]")
    steps = [
        ("fit", counts, "--ep-size", 4, "--redundant", 4, "-o", tmp / "layout.json", "-q"),
        ("convert", tmp / "layout.json", "--to", "sglang", "-o", tmp / "layout.sglang.json", "-q"),
        ("convert", tmp / "layout.json", "--to", "vllm-ascend", "-o", tmp / "expert_map.json", "-q"),
        ("report", tmp / "layout.json", counts, "-o", tmp / "report", "-q"),
        ("hash-counts", "--model", model, "--token-ids", tmp / "ids.json", "-o", tmp / "hash.npz", "-q"),
    ]
    for step in steps:
        done = _cli_under(umask, *step)
        assert done.returncode == 0, (step, done.stderr)
    report = sorted((tmp / "report").iterdir())
    assert {p.suffix for p in report} >= {".md", ".json", ".png"}, report
    return [tmp / n for n in ("layout.json", "layout.sglang.json", "expert_map.json", "hash.npz")] + report


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_every_file_the_cli_writes_has_the_mode_the_umask_gives(tmp_path, umask, mode):
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in _written(tmp_path, umask)}
    assert modes == {name: mode for name in modes}


def test_the_umask_is_read_without_being_changed():
    before = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        assert current_umask() == 0o027  # reading it left it as it was
    finally:
        os.umask(before)


def test_an_atomic_write_replaces_a_private_file_with_a_readable_one(tmp_path):
    """An output left 0600 by an earlier version is replaced by a file of the umask's mode."""
    from vllm_scene_eplb.fileio import atomic_write_bytes

    old = tmp_path / "layout.json"
    old.write_text("{}")
    old.chmod(0o600)
    before = os.umask(0o022)
    try:
        atomic_write_bytes(old, np.zeros(3).tobytes())
    finally:
        os.umask(before)
    assert stat.S_IMODE(old.stat().st_mode) == 0o644
