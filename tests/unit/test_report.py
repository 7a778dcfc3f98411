"""`scene-eplb report`: the old (linear) layout, vLLM's policy fitted on the same counts and the new
layout side by side, the fitted scene marked, and scores with no observation said once, with why."""

import json
import re

import numpy as np
import torch
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import read_counts
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry, Layout
from vllm_scene_eplb.layouts.report import write_report
from vllm_scene_eplb.layouts.score import ideal_score

from ..conftest import cli, skewed_counts


def test_the_shipped_scenes_read_against_vllms_policy(tmp_path, real_counts_paths):
    """A layout fitted on one shipped scene (EP16, 16 redundant slots, 8 routing groups), reported
    on it and on another: vLLM's own policy (torch, as vLLM runs it) on the same counts in every
    table, the fitted scene marked, and one line where the holdout is not observed."""
    decode, p1024, p4096 = real_counts_paths
    assert cli("fit", p4096, "--ep-size", 16, "--redundant", 16, "--expert-groups", 8, "-o", tmp_path / "l.json").returncode == 0
    proc = cli("report", tmp_path / "l.json", p4096, p1024, "-o", tmp_path / "rep", "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    scores = json.loads((tmp_path / "rep" / "scores.json").read_text())["scenes"]

    g = Geometry(256, 16, 16)
    c = read_counts(p4096)
    moe = list(range(3, 61))
    vllm = DefaultEplbPolicy.rebalance_experts(torch.from_numpy(c.total()[moe]), 272, 8, 1, 16).numpy()
    for scene, path in zip(scores, (p4096, p1024)):
        own = ideal_score(vllm, read_counts(path).total()[moe], g)
        assert scene["summary"]["vllm_train"] == {"median": float(np.median(own)), "worst": float(own.max())}
        assert [r["vllm_train"] for r in scene["layers"]] == own.tolist()
        assert scene["summary"]["vllm_policy"]["fitted_on"] == "the counts the layout was fitted on"
    assert [s["summary"]["fitted_scene"] for s in scores] == [True, False]

    rows = re.findall(
        r"^\| (prefill_in\d+) \| ([a-z ]+) \| [\d.]+ / [\d.]+ \| ([\d.]+) / ([\d.]+) \| [\d.]+ / [\d.]+ \|$", md, re.M
    )
    vllm_cells = [(f"{s['summary']['vllm_train']['median']:.4f}", f"{s['summary']['vllm_train']['worst']:.4f}") for s in scores]
    assert [r[:2] for r in rows] == [("prefill_in4096", "fitted on"), ("prefill_in1024", "out of scene")]
    assert [r[2:] for r in rows] == vllm_cells
    assert "| vLLM's policy, ideal |" in md and md.count("| layer | old train | vLLM train | new train | new static |") == 2
    assert "8 routing group(s) (from the layout's fit)" in md and "Scene: out of scene." in md
    # no column of NOT_OBSERVED cells: one line per scene, saying why
    note = "NOT_OBSERVED: old_holdout, vllm_holdout, new_holdout, new_per_pass_holdout: the counts hold 1 written ring entry"
    assert md.count("NOT_OBSERVED") == 2 and md.count(note) == 2 and "| NOT_OBSERVED" not in md
    text = cli("report", tmp_path / "l.json", p4096, "-o", tmp_path / "rep1").stdout
    assert text.count("NOT_OBSERVED") == 1 and note in text and "scene: fitted on" in text


def test_counts_with_a_holdout_show_every_score_and_no_note(tmp_path):
    g = Geometry(32, 8, 4)
    train = Counts(skewed_counts(6, 3, 32, seed=3))
    layout = fit(train, FitOptions(g, expert_groups=4))
    (ev,), md_path, pngs = write_report(layout, [("own", train)], tmp_path)
    md = md_path.read_text()
    assert ev.not_observed() is None and "NOT_OBSERVED" not in md
    assert "| vLLM holdout |" in md and "| vLLM's policy, holdout (ideal) |" in md
    assert ev.summary()["vllm_holdout"] is not None and ev.summary()["vllm_policy"]["expert_groups"] == 4
    assert "Scene: fitted on." in md and pngs[0].read_bytes()[:4] == b"\x89PNG"


def test_a_layout_that_names_no_fit_counts_gets_vllm_fitted_on_the_scenes_given(tmp_path):
    """A bare layout (converted, or another tool's) names no fit counts: the scenes are neither
    fitted on nor out of scene, and vLLM's policy is fitted on them all, which the report says."""
    g = Geometry(32, 8, 4)
    a, b = (Counts(skewed_counts(1, 2, 32, seed=s)) for s in (4, 5))
    fitted = fit(a, FitOptions(g))
    bare = Layout(fitted.physical_to_logical_map, g)
    evals, md_path, _ = write_report(bare, [("a", a), ("b", b)], tmp_path, expert_groups=2, groups_from="--model")
    md = md_path.read_text()
    assert [ev.fitted_scene for ev in evals] == [None, None] and md.count("| fit counts unknown |") == 2
    assert (
        "fitted on every scene given (the layout's own fit counts are not all among them), 2 routing group(s) (from --model)"
        in md
    )
