"""`bench` result handling and `compare`'s refusals and warnings (the field report's traps)."""

import json
import subprocess
import sys

import pytest

from vllm_scene_eplb.ab.bench import resolve_cards
from vllm_scene_eplb.ab.compare import compare
from vllm_scene_eplb.ab.results import NOT_OBSERVED, BenchLoad, aggregate, read_result, summarise
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fileio import doc_checksum
from vllm_scene_eplb.protocol import StatusAnswer

from ..conftest import worker_status

SCENE = BenchLoad("s", num_prompts=4, concurrency=2, request_rate=float("inf"), input_len=100, output_len=3, cards=2)


def _raw(duration=100.0, starts=(0.0, 0.0, 50.0, 50.0), latency=50.0):
    """A vllm bench serve result: 4 requests, 2 at a time, each 50 s, 3 output tokens."""
    n = len(starts)
    return {
        "duration": duration,
        "completed": n,
        "failed": 0,
        "total_input_tokens": 100 * n,
        "total_output_tokens": 3 * n,
        "start_times": list(starts),
        "latencies": [latency] * n,
        "ttfts": [10.0] * n,
        "itls": [[20.0, 20.0]] * n,
        "input_lens": [100] * n,
        "p50_ttft_ms": 10000.0,
        "p99_ttft_ms": 10000.0,
        "p50_tpot_ms": 20000.0,
        "p99_tpot_ms": float("nan"),
    }


def test_summarise_per_card_and_steady_window():
    s = summarise(_raw(), SCENE)
    assert s["output_throughput_per_card"] == pytest.approx(12 / 100 / 2)
    assert s["prefill_throughput_per_card"] == pytest.approx(400 / 100 / 2)
    assert s["window_s"] == pytest.approx(100.0) and s["steady_state"] is True
    assert s["tpot_p99_ms"] == NOT_OBSERVED  # NaN is not a measurement


def test_short_window_is_not_steady_state():
    s = summarise(_raw(duration=20.0, starts=(0, 0, 10, 10), latency=10.0), SCENE)
    assert s["window_s"] == pytest.approx(20.0) and s["steady_state"] is False


def _doc(scene=SCENE, runs=None, **manifest):
    runs = runs or [summarise(_raw(), scene)]
    m = {
        "scene": scene.__dict__ | {},
        "model": "m",
        "quantization": NOT_OBSERVED,
        "role": "prefill",
        "chunk_size": 4096,
        "parallel": "TP2-EP2",
        "ep_size": 2,
        "redundant_slots": 0,
        "layout_hash": None,
        "dispatch": None,
        "recorder": "idle",
    }
    m.update(manifest)
    return {"format": "scene-eplb-bench", "version": 1, "manifest": m, "runs": runs, "aggregate": aggregate(runs)}


def test_compare_refuses_different_load():
    b = _doc(scene=BenchLoad("s", 8, 2, float("inf"), 100, 3, cards=2))
    with pytest.raises(SceneEplbError, match="different load.*num_prompts 4 vs 8"):
        compare(_doc(), b)


def test_layout_alone_is_one_knob_and_two_knobs_are_a_combined_effect():
    a = _doc()
    c = compare(a, _doc(layout_hash="abc", redundant_slots=2, dispatch="static"))
    assert c.knobs == ["layout"] and not any("combined" in w for w in c.warnings)
    c = compare(
        _doc(layout_hash="abc", redundant_slots=2, dispatch="static"),
        _doc(layout_hash="def", redundant_slots=2, dispatch="dynamic"),
    )
    assert c.knobs == ["layout", "dispatch"] and any("combined effect" in w for w in c.warnings)


def test_short_window_missing_metric_and_noise_are_said():
    short = [summarise(_raw(duration=20.0, starts=(0, 0, 10, 10), latency=10.0), SCENE)] * 2
    c = compare(_doc(runs=short), _doc(runs=short, layout_hash="x", redundant_slots=2))
    assert any("under 60 s" in w for w in c.warnings)
    assert any(w.startswith("tpot_p99_ms: not observed") for w in c.warnings)
    row = next(r for r in c.rows if r["metric"] == "prefill_throughput_per_card")
    assert row["verdict"] == "within noise" and row["ratio"] == pytest.approx(1.0)
    assert next(r for r in c.rows if r["metric"] == "tpot_p99_ms")["ratio"] == NOT_OBSERVED


def test_cli_compare_json_and_checksum(tmp_path):
    paths = []
    for name, doc in (("a", _doc()), ("b", _doc(layout_hash="abc", redundant_slots=2))):
        doc = json.loads(json.dumps(doc))
        doc["checksum"] = doc_checksum(doc)
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    res = subprocess.run(
        [sys.executable, "-m", "vllm_scene_eplb.cli", "compare", *map(str, paths), "--json", "-o", str(tmp_path / "cmp")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["knobs_changed"] == ["layout"] and (tmp_path / "cmp" / "compare.png").stat().st_size > 0
    read_result(paths[0])
    paths[1].write_text(paths[1].read_text().replace('"completed": 4', '"completed": 5', 1))
    res = subprocess.run(
        [sys.executable, "-m", "vllm_scene_eplb.cli", "compare", *map(str, paths)], capture_output=True, text=True
    )
    assert res.returncode == 2 and "checksum mismatch" in res.stderr and "Traceback" not in res.stderr


def _dp_status(dp: int, tp: int) -> StatusAnswer:
    ranks = [worker_status(d * tp + t, dp_rank=d, tp_rank=t, ep_size=dp * tp) for d in range(dp) for t in range(tp)]
    return StatusAnswer.of_ranks(ranks)


def test_cards_default_to_the_servers_ranks_in_dp_unless_given():
    open_scene = BenchLoad("s", 4, 2, float("inf"), 100, 3)
    scene, source = resolve_cards(open_scene, _dp_status(16, 1))
    assert scene.cards == 16 and "DP16-TP1-EP16" in source  # the field P node: 16 cards, not 1
    assert resolve_cards(BenchLoad("s", 4, 2, float("inf"), 100, 3, cards=32), _dp_status(16, 1)) == (
        BenchLoad("s", 4, 2, float("inf"), 100, 3, cards=32),
        "--cards",
    )  # P + D cards given


def test_fewer_cards_than_the_servers_ranks_are_refused():
    with pytest.raises(SceneEplbError, match="fewer than the 4 ranks"):
        resolve_cards(BenchLoad("s", 4, 2, float("inf"), 100, 3, cards=2), _dp_status(2, 2))


def test_cards_are_needed_where_the_server_does_not_say_its_ranks():
    with pytest.raises(SceneEplbError, match="--cards is needed"):
        resolve_cards(BenchLoad("s", 4, 2, float("inf"), 100, 3), None)


def test_throughput_per_card_divides_by_the_cards():
    raw = _raw()
    assert summarise(raw, BenchLoad("s", 4, 2, float("inf"), 100, 3, cards=16))["output_throughput_per_card"] == pytest.approx(
        summarise(raw, BenchLoad("s", 4, 2, float("inf"), 100, 3, cards=1))["output_throughput_per_card"] / 16
    )


def test_the_prefill_metric_is_the_steady_one_only_where_every_run_saw_it():
    from vllm_scene_eplb.ab.results import PREFILL_METRICS, prefill_metric

    steady, whole = PREFILL_METRICS

    def doc(*runs):
        return {"runs": [dict(r) for r in runs]}

    both = {steady: 5.0, whole: 4.0}
    assert prefill_metric([doc(both), doc(both, both)]) == steady
    assert prefill_metric([doc(both), doc(both, {steady: NOT_OBSERVED, whole: 4.0})]) == whole  # one run had no window
    assert prefill_metric([doc(both), doc({steady: 0.0, whole: 4.0})]) == whole  # a steady window without prefill
    assert prefill_metric([doc({whole: 4.0})]) == whole
