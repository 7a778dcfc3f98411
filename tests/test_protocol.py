"""The wire contract: the startup line round-trips through its parser, the status aggregate says
when ranks disagree."""

from vllm_scene_eplb.protocol import AGREE_KEY, RANKS_KEY, aggregate_status, parse_startup_lines, startup_line


def _status(ep_rank, **over):
    return {
        "role": "prefill",
        "observer": "idle",
        "layout_hash": "abc",
        "redundant_slots": 2,
        "dispatch": "static",
        "ep_size": 2,
        "ep_rank": ep_rank,
        "dp_rank": ep_rank,
        "tp_rank": 0,
        "ring_entries": 64,
        "entries_written": 0,
        "passes_recorded": 0,
        **over,
    }


def test_startup_line_round_trips():
    line = startup_line(_status(0), "ep_rank 0")
    assert parse_startup_lines(f"INFO x {line}\n") == [
        {"role": "prefill", "observer": "idle", "layout_hash": "abc", "redundant_slots": 2, "dispatch": "static"}
    ]
    linear = startup_line(_status(1, layout_hash=None, dispatch=None, redundant_slots=0), "ep_rank 1")
    assert "layout_hash=none (linear)" in linear and parse_startup_lines(linear)[0]["layout_hash"] is None


def test_aggregate_lists_every_rank_in_ep_order_and_flags_disagreement():
    agg = aggregate_status([_status(1, passes_recorded=5), _status(0, passes_recorded=7)])
    assert agg["ep_rank"] == 0 and [r["ep_rank"] for r in agg[RANKS_KEY]] == [0, 1]
    assert [r["passes_recorded"] for r in agg[RANKS_KEY]] == [7, 5] and agg[AGREE_KEY]  # counters may differ
    assert not aggregate_status([_status(0), _status(1, layout_hash="def")])[AGREE_KEY]
    assert not aggregate_status([_status(0), _status(1, observer="recording")])[AGREE_KEY]
