"""The fitter's output pinned per fitter version: equal fingerprints must mean equal layouts.

``tests/golden/fit.json`` holds, for each fitter version, the fingerprint and layout hash of fixed
fits. A change to the fitter that changes a layout must bump ``FITTER_VERSION`` (so fingerprints
change with it) and record the new version's goldens:

    python -m tests.test_golden_fit --update
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_scene_eplb.fit import FITTER_VERSION, FitOptions, fit
from vllm_scene_eplb.formats import read_counts
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry

from ..conftest import DATA, skewed_counts

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "fit.json"


def _cases() -> dict:
    synthetic = Counts(skewed_counts(8, 4, 32, seed=11))
    return {
        "synthetic-ep8-r8-2nodes-static-groups4": (
            synthetic,
            FitOptions(Geometry(32, 8, 8, 2), dispatch="static", expert_groups=4),
        ),
        "synthetic-ep4-r4-dynamic-robust": (synthetic, FitOptions(Geometry(32, 4, 4), dispatch="dynamic", robust=True)),
        "deepseek-prefill4096-ep16-r16-static-groups8": (
            read_counts(DATA / "prefill_in4096.json"),
            FitOptions(Geometry(256, 16, 16), dispatch="static", expert_groups=8),
        ),
        "deepseek-two-prefill-scenes-ep16-r16-dynamic-worst": (
            [read_counts(DATA / "prefill_in4096.json"), read_counts(DATA / "prefill_in1024.json")],
            FitOptions(Geometry(256, 16, 16), dispatch="dynamic", expert_groups=8, objective="worst"),
        ),
    }


def _results() -> dict:
    out = {}
    for name, (counts, options) in _cases().items():
        layout = fit(counts, options)
        out[name] = {"fingerprint": layout.meta["fingerprint"], "layout_hash": layout.digest()}
    return out


def test_equal_fingerprints_give_equal_layouts():
    golden = json.loads(GOLDEN.read_text())
    if FITTER_VERSION not in golden:
        pytest.fail(f"no golden layouts for fitter version {FITTER_VERSION}: run python -m tests.test_golden_fit --update")
    want = golden[FITTER_VERSION]
    got = _results()
    assert set(got) == set(want)
    for name in want:
        assert got[name]["fingerprint"] == want[name]["fingerprint"], f"{name}: the fingerprint's inputs changed"
        assert got[name]["layout_hash"] == want[name]["layout_hash"], (
            f"{name}: same fingerprint, different layout: the fitter changed without a new FITTER_VERSION"
        )


def _update() -> None:
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    golden[FITTER_VERSION] = _results()
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} for {FITTER_VERSION}")


if __name__ == "__main__" and "--update" in sys.argv:
    _update()
