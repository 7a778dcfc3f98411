"""The count -> time model and the go/no-go advisor, on counts and timing windows made here: a
skewed scene whose fitted layout shortens the slowest rank says trial with the predicted ratio the
model gives by hand; an even scene says skip; missing evidence says so; the CLI reads a saved status."""

import json

import numpy as np
import pytest

from vllm_scene_eplb.advise import advise, fit_time_model
from vllm_scene_eplb.counts import Counts
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import write_counts, write_layout
from vllm_scene_eplb.layout import Geometry

from .test_bad_input import run

E, L, EP, T = 8, 2, 2, 8
A_MS, B_MS, OTHER_MS = 0.2, 0.001, 6.0  # the "device": ms = 0.2 + 0.001 x assignments per rank, plus 6 ms outside MoE


def _scene(p: np.ndarray, seed: int = 0) -> Counts:
    """T passes of 4096 assignments per layer on the linear layout (no layout loaded: slot = expert)."""
    logical = np.random.default_rng(seed).multinomial(4096, p, size=(T, L))
    return Counts(logical, {"moe_layers": list(range(L))}, physical=logical.copy())


def _timing(counts: Counts) -> dict:
    """The running server's timing window: per rank and layer, assignments per pass and the ms they take."""
    loads = counts.physical.sum(axis=0).reshape(L, EP, -1).sum(axis=2) / T  # [L, ranks]
    ms = A_MS + B_MS * loads
    return {
        "rank_ms": ms.T.tolist(),
        "rank_assignments": loads.T.tolist(),
        "step_ms": OTHER_MS + ms.max(axis=1).sum(),
        "moe_share": float(ms.mean(axis=1).sum() / (OTHER_MS + ms.max(axis=1).sum())),
    }


SKEWED = np.array([8, 6, 5, 4, 1, 1, 1, 1], dtype=float) / 27  # the hot experts all on rank 0 of the linear layout
EVEN = np.full(E, 1 / E)


def _candidate(counts: Counts):
    return fit(counts, FitOptions(Geometry(E, 2, EP), dispatch="static"))


def test_a_skewed_scene_says_trial_with_the_ratio_the_model_gives():
    counts = _scene(SKEWED)
    layout = _candidate(counts)
    answer = advise(counts, layout, "static", _timing(counts))
    assert answer["verdict"] == "trial", answer["reasons"]
    d = answer["details"]
    assert d["model_residual"] < 1e-9 and np.allclose(d["model"]["b"], B_MS)  # the line is recovered exactly
    expected = d["step_ms"] / (d["step_ms"] - d["critical_ms_now"] + d["critical_ms_candidate"])
    assert answer["predicted_throughput_ratio"] == pytest.approx(expected) and answer["predicted_throughput_ratio"] > 1.1
    assert any("first half" in r for r in answer["reasons"]) and any("MoE is" in r for r in answer["reasons"])


def test_an_even_scene_says_skip():
    counts = _scene(EVEN, seed=1)
    answer = advise(counts, _candidate(counts), "static", _timing(counts))
    assert answer["verdict"] == "skip" and answer["predicted_throughput_ratio"] < 1.02, answer


def test_a_gain_that_does_not_hold_on_both_halves_says_skip():
    first, second = _scene(SKEWED), _scene(EVEN, seed=2)  # the skew is gone in the second half of the recording
    data = np.concatenate([first.data[: T // 2], second.data[: T // 2]])
    counts = Counts(data, first.meta, physical=data.copy())
    layout = _candidate(Counts(first.data))  # fitted on the first half's scene only
    answer = advise(counts, layout, "static", _timing(counts))
    assert answer["verdict"] == "skip" and answer["predicted_throughput_ratio"] > 1.02, answer["reasons"]
    assert min(answer["details"]["halves"]) < 1.02 < max(answer["details"]["halves"])
    assert "does not hold on both halves" in answer["reasons"][-1]


def test_missing_evidence_says_so():
    counts = _scene(SKEWED)
    layout = _candidate(counts)
    assert advise(counts, layout, "static", None)["verdict"] == "insufficient_evidence"
    assert "time_moe" in advise(counts, layout, "static", {})["reasons"][-1]
    no_physical = Counts(counts.data, counts.meta)
    assert "physical_count" in advise(no_physical, layout, "static", _timing(counts))["reasons"][-1]


def test_a_slope_that_is_not_positive_takes_the_pooled_fit():
    model = fit_time_model(np.array([[1.0, 2.0], [1.0, 1.0]]), np.array([[100.0, 200.0], [100.0, 100.0]]))
    assert (model.b > 0).all()


def test_the_cli_reads_a_saved_status_and_exits_by_verdict(tmp_path):
    counts = _scene(SKEWED)
    write_counts(counts, tmp_path / "dump.npz")
    write_layout(_candidate(counts), tmp_path / "cand.json")
    (tmp_path / "status.json").write_text(json.dumps({"live": {"time": _timing(counts)}}))
    code, out, err = run(
        "advise", tmp_path / "dump.npz", "--layout", tmp_path / "cand.json", "--timing", tmp_path / "status.json", "--json"
    )
    assert code == 0 and json.loads(out)["verdict"] == "trial", err
    code, out, _ = run("advise", tmp_path / "dump.npz", "--layout", tmp_path / "cand.json")
    assert code == 1 and "insufficient_evidence" in out
