"""The wire contract: the startup line round-trips through its parser, the status aggregate says
when ranks disagree, and every worker answer crosses as its typed object (``to_wire`` at the
worker, ``from_wire`` at the API server) key for key, a broken one refused with its field named."""

import dataclasses
import json
import re

import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.protocol import (
    AGREE_KEY,
    RANKS_KEY,
    STATUS_KEYS,
    Advice,
    DumpAnswer,
    DumpStarted,
    ExportJobAnswer,
    NativeCounts,
    RankLiveAnswer,
    RankNativeLoad,
    RecordLive,
    StatusAnswer,
    WorkerAnswer,
    WorkerStatus,
    parse_startup_lines,
    startup_line,
)

from ..conftest import worker_status


def aggregate_status(statuses: list[WorkerStatus]) -> dict:
    return StatusAnswer.of_ranks(statuses).to_wire()


def test_startup_line_round_trips():
    line = startup_line(worker_status(0), "ep_rank 0")
    assert [r.to_wire() for r in parse_startup_lines(f"INFO x {line}\n")] == [
        {
            "role": "prefill",
            "observer": "idle",
            "layout_hash": "abc",
            "redundant_slots": 2,
            "dispatch": "static",
            "load_audit": None,
        }
    ]
    audited = startup_line(worker_status(0, load_audit="passed:16-slots,48-writes"), "ep_rank 0")
    assert parse_startup_lines(audited)[0].load_audit == "passed:16-slots,48-writes"
    old = "scene-eplb: role=prefill observer=idle layout_hash=abc redundant_slots=2 dispatch=static ep_size=2 (ep_rank 0)"
    assert parse_startup_lines(old)[0].load_audit is None  # a line from before the audit still reads
    linear = startup_line(worker_status(1, layout_hash=None, dispatch=None, redundant_slots=0), "ep_rank 1")
    assert "layout_hash=none (linear)" in linear and parse_startup_lines(linear)[0].layout_hash is None


def test_aggregate_lists_every_rank_in_ep_order_and_flags_disagreement():
    agg = aggregate_status([worker_status(1, passes_recorded=5), worker_status(0, passes_recorded=7)])
    assert agg["ep_rank"] == 0 and [r["ep_rank"] for r in agg[RANKS_KEY]] == [0, 1]
    assert [r["passes_recorded"] for r in agg[RANKS_KEY]] == [7, 5] and agg[AGREE_KEY]  # counters may differ
    assert not aggregate_status([worker_status(0), worker_status(1, layout_hash="def")])[AGREE_KEY]
    assert not aggregate_status([worker_status(0), worker_status(1, observer="recording")])[AGREE_KEY]


def test_status_keys_are_the_status_fields_in_order():
    assert STATUS_KEYS == tuple(worker_status(0).to_wire()) and STATUS_KEYS[-3:] == (
        "server_start",
        "load_audit",
        "drafter_layers",
    )


JOB = {"export_id": "x", "state": "running", "path": "/d/counts.npz", "error": None, "export_seconds": None}
STARTED = {
    **JOB,
    "ep_rank": 1,
    "shape": [64, 4, 8],
    "physical_shape": None,
    "entries_written": 3,
    "passes_recorded": 3,
    "local_total": 48,
}
LIVE = {
    "counts": [[1, 2], [3, 4]],
    "physical": None,
    "own_counts": [[1, 0], [0, 4]],
    "passes": 2,
    "moe_seconds": [0.5, 0.25],
    "moe_passes": 2,
    "steps": 2,
    "step_seconds": 1.5,
    "step_moe_seconds": 0.75,
    "gap_seconds": 0.25,
    "gaps": 2,
    "contributes": True,
    "ep_rank": 0,
    "source": [0, 2],
    "moe_layers": [1, 2],
    "active_slots": [3, 2],
    "groups": {  # the passes by size (protocol.PASS_GROUP_TOKENS): both in the first group
        "passes": [2, 0, 0, 0],
        "seconds": [[0.5, 0.25], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]],
        "assignments": [[3, 4], [0, 0], [0, 0], [0, 0]],
        "active": [[3, 2], [0, 0], [0, 0], [0, 0]],
    },
    "wait_seconds": 0.01,
    "drafter_layers": [3],  # a drafter's MoE layer, its live counts apart
    "drafter_counts": [[2, 1]],
}
PASSES = {"first": 3, "ms": [[0.5, 0.25], [0.25, 0.5]]}
# every worker answer: (its payload reader, what a worker sends)
PAYLOADS = {
    "status": (WorkerStatus.from_wire, worker_status(0).to_wire()),
    "export_status": (ExportJobAnswer.from_wire, JOB),
    "dump": (DumpStarted.from_wire, STARTED),
    "live": (RankLiveAnswer.from_wire, LIVE),
    "record_live": (RecordLive.from_wire, {"start": LIVE, "stop": {**LIVE, "passes": 5}, "passes": None}),
    # with the record's passes logged: passes 3 and 4, ms per MoE layer
    "record_live logged": (RecordLive.from_wire, {"start": LIVE, "stop": {**LIVE, "passes": 5}, "passes": PASSES}),
    "native_load available": (
        RankNativeLoad.from_wire,
        {"ep_rank": 0, "moe_layers": [1, 2], "available": True, "counts": [[1, 2], [3, 4]]},
    ),
    "native_load unavailable": (
        RankNativeLoad.from_wire,
        {"ep_rank": 0, "moe_layers": [1, 2], "available": False, "reason": "no counters"},
    ),
}


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_a_worker_answer_crosses_key_for_key(name):
    read, payload = PAYLOADS[name]
    wire = {"ok": True, **payload}
    answer = WorkerAnswer.from_wire(wire, read)
    assert answer.ok and answer.to_wire() == wire and list(answer.to_wire()) == list(wire)


def test_a_refusal_crosses_with_its_http_status():
    wire = WorkerAnswer.refused("recording is already on", 409).to_wire()
    assert wire == {"ok": False, "error": "recording is already on", "http_status": 409}
    back = WorkerAnswer.from_wire(wire, WorkerStatus.from_wire)
    assert not back.ok and back.error == "recording is already on" and back.http_status == 409


BROKEN = {
    "not an object": (RankLiveAnswer.from_wire, [1, 2], "must be a JSON object"),
    "live counts ragged": (RankLiveAnswer.from_wire, {**LIVE, "counts": [[1, 2], [3]]}, "counts row 1"),
    "live counts negative": (RankLiveAnswer.from_wire, {**LIVE, "counts": [[1, -2], [3, 4]]}, "counts[0][1]"),
    "live counts one row for two layers": (RankLiveAnswer.from_wire, {**LIVE, "counts": [[1, 2]]}, "counts must be"),
    "live moe_seconds nan": (RankLiveAnswer.from_wire, {**LIVE, "moe_seconds": [float("nan"), 1.0]}, "moe_seconds[0]"),
    "live source of three": (RankLiveAnswer.from_wire, {**LIVE, "source": [0, 1, 2]}, "source must be a list of 2"),
    "live contributes a string": (RankLiveAnswer.from_wire, {**LIVE, "contributes": "yes"}, "contributes must be true or false"),
    "record live without its stop": (RecordLive.from_wire, {"start": LIVE}, "no 'stop'"),
    "record live stop not an object": (RecordLive.from_wire, {"start": LIVE, "stop": [1]}, "stop must be an object"),
    "record live stop broken": (RecordLive.from_wire, {"start": LIVE, "stop": {**LIVE, "passes": -1}}, "passes must be"),
    "record passes for one layer": (
        RecordLive.from_wire,
        {"start": LIVE, "stop": LIVE, "passes": {**PASSES, "ms": [[0.5], [0.25]]}},
        "ms has 1 values a pass, for 2 MoE layers",
    ),
    "record passes negative": (
        RecordLive.from_wire,
        {"start": LIVE, "stop": LIVE, "passes": {**PASSES, "ms": [[0.5, -1.0], [0.25, 0.5]]}},
        "ms[0][1]",
    ),
    "record passes without first": (
        RecordLive.from_wire,
        {"start": LIVE, "stop": LIVE, "passes": {"ms": [[0.5, 0.2]]}},
        "no 'first'",
    ),
    "dump shape of two": (DumpStarted.from_wire, {**STARTED, "shape": [4, 8]}, "shape must be a list of 3"),
    "job state bogus": (ExportJobAnswer.from_wire, {**JOB, "state": "bogus"}, "state must be one of running, done, failed"),
    "native without counts": (
        RankNativeLoad.from_wire,
        {"ep_rank": 0, "moe_layers": [1], "available": True},
        "no 'counts'",
    ),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_worker_answer_names_its_field(name):
    read, payload, expected = BROKEN[name]
    wire = {"ok": True, **payload} if isinstance(payload, dict) else payload
    with pytest.raises(SceneEplbError, match=expected.replace("[", r"\[")):
        WorkerAnswer.from_wire(wire, read)


def test_a_worker_answer_without_ok_is_refused():
    with pytest.raises(SceneEplbError, match="no 'ok'"):
        WorkerAnswer.from_wire(JOB, ExportJobAnswer.from_wire)


def test_the_dump_answer_is_rank_0s_start_done_with_every_ranks_total():
    started = [DumpStarted.from_wire({**STARTED, "ep_rank": r, "local_total": 10 + r}) for r in (1, 0)]
    jobs = [dataclasses.replace(ExportJobAnswer.from_wire(JOB), state="done", export_seconds=s) for s in (0.5, 0.25)]
    dump = DumpAnswer.of_ranks(started, jobs)
    assert dump.ep_rank == 0 and dump.state == "done" and dump.export_seconds == 0.5
    assert dump.local_total == 21 and dump.ranks == 2
    assert DumpAnswer.from_wire(dump.to_wire()) == dump


def test_native_counts_say_available_or_why_not():
    assert NativeCounts(True, counts=((1, 2),)).to_wire() == {"available": True, "counts": [[1, 2]]}
    assert NativeCounts(False, reason="none").to_wire() == {"available": False, "reason": "none"}


def status_with_time(**time) -> dict:
    """A two-rank status answer with a timed live window of two MoE layers, ``time`` changing its keys."""
    live = {
        "median": None,
        "worst": None,
        "expected_median": None,
        "expected_worst": None,
        "drift": False,
        "passes": 4,
        "window_seconds": 5.0,
        "windows": 1,
        "threshold": None,
        "dispatch": "static",
        "layers": [1, 2],
        "per_layer": None,
        "measured": None,
        "fidelity": None,
        "time": {
            "median": 1.2,
            "worst": 1.5,
            "moe_share": 0.4,
            "step_ms": 10.0,
            "rank_ms": [[1.0, 2.0], [1.5, 1.0]],
            "per_layer": [1.2, 1.33],
            "rank_assignments": [[8.0, 16.0], [12.0, 8.0]],
            "sub_windows": [9.5, 10.0],
            "provenance": {"role": "decode"},
            **time,
        },
    }
    return {**StatusAnswer.of_ranks([worker_status(0), worker_status(1)]).to_wire(), "live": live}


def test_the_typed_status_gives_the_timing_window_the_raw_one_gives():
    from vllm_scene_eplb.protocol import TimingWindow

    doc = status_with_time()
    typed = TimingWindow.of_status(StatusAnswer.from_wire(doc), "http://x", layers=2)
    assert typed == TimingWindow.from_status(doc, "http://x", layers=2)
    assert typed is not None and typed.provenance["role"] == "decode" and typed.provenance["layout_hash"] == "abc"


def test_the_pause_between_steps_reads_the_same_typed_and_raw_and_a_status_without_it_reads_zero():
    from vllm_scene_eplb.protocol import TimingWindow

    doc = status_with_time(gap_ms=12.5)
    for read in (lambda d: TimingWindow.of_status(StatusAnswer.from_wire(d), "u"), lambda d: TimingWindow.from_status(d, "u")):
        assert read(doc).gap_ms == 12.5 and read(status_with_time()).gap_ms == 0.0
    window = TimingWindow.from_status(doc, "u")
    assert TimingWindow.from_wire(window.to_wire()) == window


def test_a_status_with_a_record_window_is_priced_on_it_and_one_saved_without_reads_its_live_window():
    from vllm_scene_eplb.protocol import TimingWindow

    doc = status_with_time()
    record = {**doc["live"]["time"], "rank_ms": [[0.5, 0.5], [0.5, 0.5]], "step_ms": 4.0}
    with_record = {**doc, "live": {**doc["live"], "record_time": record}}
    for read in (
        lambda d: TimingWindow.of_status(StatusAnswer.from_wire(d), "u", layers=2),
        lambda d: TimingWindow.from_status(d, "u", layers=2),
    ):
        got, saved = read(with_record), read(doc)  # ``doc``: a status saved before record_time existed
        assert got is not None and got.step_ms == 4.0 and got.rank_ms[0] == (0.5, 0.5) and got.record
        assert saved is not None and saved.step_ms == 10.0 and not saved.record
        assert TimingWindow.from_wire(got.to_wire()) == got  # a saved window still says it was a record's
    answer = StatusAnswer.from_wire(with_record)
    assert answer.live is not None and StatusAnswer.from_wire(answer.to_wire()) == answer
    assert StatusAnswer.from_wire({**doc, "live": {**doc["live"], "record_time": None}}).live.record_time is None
    empty = {**doc, "live": {**doc["live"], "record_time": {}}}  # a record window with nothing in it is refused, not skipped
    with pytest.raises(SceneEplbError, match="record_time has no 'median'"):
        TimingWindow.from_status(empty, "u")
    with pytest.raises(SceneEplbError, match="has no rank_ms"):
        TimingWindow.from_status(empty["live"], "u")  # a saved live object, read as the window it holds


def test_the_active_slots_read_the_same_typed_and_raw_and_a_status_without_them_reads_none():
    from vllm_scene_eplb.protocol import TimingWindow

    doc = status_with_time(rank_active_slots=[[3.0, 2.5], [4.0, 1.0]])
    for read in (lambda d: TimingWindow.of_status(StatusAnswer.from_wire(d), "u"), lambda d: TimingWindow.from_status(d, "u")):
        assert read(doc).rank_active_slots == ((3.0, 2.5), (4.0, 1.0)) and read(status_with_time()).rank_active_slots is None
    window = TimingWindow.from_status(doc, "u")
    assert TimingWindow.from_wire(window.to_wire()) == window


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"rank_assignments": None}, "timing has no rank_assignments"),
        ({"step_ms": 2.0}, "shorter than"),
        ({"rank_assignments": [[8.0], [12.0]]}, "rank_assignments is [2][1]"),
        ({"gap_ms": -1.0}, "gap_ms must be a finite number in [0, inf]"),
    ],
    ids=["no_assignments", "step_shorter_than_moe", "assignments_of_another_shape", "negative_pause"],
)
def test_the_typed_status_checks_its_timing_window_like_the_raw_one(change, expected):
    from vllm_scene_eplb.protocol import TimingWindow

    doc = status_with_time(**change)
    for read in (lambda: TimingWindow.of_status(StatusAnswer.from_wire(doc), "u"), lambda: TimingWindow.from_status(doc, "u")):
        with pytest.raises(SceneEplbError, match=re.escape(expected)):
            read()


ADVICE = Advice(
    "trial",
    1.25,
    ("count -> time model: ...", "predicted gain +25.0% clears the noise floor"),
    {"noise_floor": 0.02, "model": {"a": [0.1], "b": [0.01]}, "fidelity_now": None, "halves": [1.2, 1.3]},
)


@pytest.mark.parametrize(
    "advice",
    [ADVICE, Advice("insufficient_evidence", None, ("no timing window",), {})],
    ids=["trial_with_its_figures", "insufficient_without_a_ratio"],
)
def test_advice_crosses_as_json_key_for_key(advice):
    wire = json.loads(json.dumps(advice.to_wire()))
    assert list(wire) == ["verdict", "predicted_throughput_ratio", "reasons", "details"]
    assert Advice.from_wire(wire) == advice and wire == advice.to_wire()


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"verdict": "maybe"}, "verdict must be one of trial, skip, insufficient_evidence"),
        ({"verdict": None}, "verdict must be one of"),
        ({"predicted_throughput_ratio": float("nan")}, "predicted_throughput_ratio must be a finite number > 0"),
        ({"predicted_throughput_ratio": float("inf")}, "predicted_throughput_ratio must be a finite number > 0"),
        ({"predicted_throughput_ratio": 0.0}, "predicted_throughput_ratio must be a finite number > 0"),
        ({"predicted_throughput_ratio": "1.2"}, "predicted_throughput_ratio must be a finite number > 0"),
        ({"reasons": ["ok", 3]}, "reasons[1] is 3"),
        ({"details": [1]}, "details must be an object"),
    ],
    ids=[
        "unknown_verdict",
        "null_verdict",
        "nan_ratio",
        "infinite_ratio",
        "zero_ratio",
        "ratio_as_text",
        "reason_not_text",
        "details_not_object",
    ],
)
def test_broken_advice_names_its_field(change, expected):
    with pytest.raises(SceneEplbError, match=re.escape(expected)):
        Advice.from_wire({**ADVICE.to_wire(), **change}, "advice.json")


def test_advice_without_a_verdict_is_refused():
    wire = ADVICE.to_wire()
    del wire["verdict"]
    with pytest.raises(SceneEplbError, match="no 'verdict'"):
        Advice.from_wire(wire)
