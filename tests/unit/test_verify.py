"""The acceptance checks behind deploy/ascend-910c/verify.sh (``ab.verify``), on files like a server's."""

import numpy as np
import pytest

from vllm_scene_eplb.ab.verify import main, prompt_tokens
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.formats import write_counts
from vllm_scene_eplb.layouts.counts import Counts

METRICS = """# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="m"}} {a}
vllm:prompt_tokens_total{{engine="1",model_name="m"}} {b}
vllm:generation_tokens_total{{engine="0",model_name="m"}} 999.0
"""


def _files(tmp_path, tokens_per_layer, top_k=2):
    data = np.zeros((3, 4, 8), dtype=np.int64)
    for layer, total in tokens_per_layer.items():
        data[0, layer, 0] = total - total // 2
        data[2, layer, 5] = total // 2
    counts = write_counts(Counts(data, {"top_k": top_k, "moe_layers": sorted(tokens_per_layer)}), tmp_path / "c.npz")
    (tmp_path / "before.txt").write_text(METRICS.format(a=100.0, b=50.0))
    (tmp_path / "after.txt").write_text(METRICS.format(a=160.0, b=90.0))  # 100 prompt tokens while recording
    return [str(counts), str(tmp_path / "before.txt"), str(tmp_path / "after.txt")]


def test_prompt_tokens_sum_every_engine():
    assert prompt_tokens(METRICS.format(a=3.0, b=4.0)) == 7
    with pytest.raises(SceneEplbError, match="no vllm:prompt_tokens_total"):
        prompt_tokens("vllm:generation_tokens_total 3\n")


def test_totals_pass_when_every_layer_counted_tokens_times_top_k(tmp_path, capsys):
    assert main(["totals", *_files(tmp_path, {1: 200, 2: 200, 3: 200})]) == 0
    assert capsys.readouterr().out.startswith("PASS per-layer totals")


def test_totals_fail_names_the_layer_that_is_off(tmp_path, capsys):
    assert main(["totals", *_files(tmp_path, {1: 200, 2: 201, 3: 200})]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and "(2, 201)" in out


def _v4_files(tmp_path, silent):
    """A V4-Flash dump (43 MoE layers, the first 3 hash-routed) with the layers in ``silent`` empty,
    and the model folder its totals are checked against."""
    import shutil
    from pathlib import Path

    (tmp_path / "model").mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "data/models/deepseek-v4-flash/config.json", tmp_path / "model")
    data = np.zeros((1, 43, 256), dtype=np.int64)
    data[0, :, 7] = 100 * 6
    data[0, silent] = 0
    counts = write_counts(Counts(data, {"top_k": 6, "moe_layers": [x for x in range(43) if x not in silent]}), tmp_path / "c.npz")
    (tmp_path / "before.txt").write_text(METRICS.format(a=100.0, b=50.0))
    (tmp_path / "after.txt").write_text(METRICS.format(a=160.0, b=90.0))
    return [str(counts), str(tmp_path / "before.txt"), str(tmp_path / "after.txt"), "--model", str(tmp_path / "model")]


def test_totals_with_the_model_pass_when_all_43_v4_layers_counted(tmp_path, capsys):
    assert main(["totals", *_v4_files(tmp_path, [])]) == 0
    assert "43 MoE layers" in capsys.readouterr().out


def test_totals_with_the_model_fail_when_v4s_hash_layers_recorded_nothing(tmp_path, capsys):
    """SGLang #25961's failure: V4-Flash's 3 token-id-routed layers empty, 40 of 43 recorded. The dump
    names only the 40 (its own moe_layers), so without the model the check would pass."""
    files = _v4_files(tmp_path, [0, 1, 2])
    assert main(["totals", *files[:3]]) == 0
    capsys.readouterr()
    assert main(["totals", *files]) == 1
    out = capsys.readouterr().out
    assert (
        out.startswith("FAIL")
        and "40 of 43 MoE layers recorded tokens, none in [0, 1, 2] (hash-routed by token id: [0, 1, 2])" in out
    )


def test_totals_with_the_model_name_a_silent_score_layer(tmp_path, capsys):
    assert main(["totals", *_v4_files(tmp_path, [20])]) == 1
    out = capsys.readouterr().out
    assert "none in [20]" in out and "hash-routed" not in out


def test_totals_fail_cleanly_on_a_file_that_is_not_a_dump(tmp_path, capsys):
    files = _files(tmp_path, {1: 200})
    (tmp_path / "bad.json").write_text("{}")
    assert main(["totals", str(tmp_path / "bad.json"), *files[1:]]) == 1
    assert capsys.readouterr().out.startswith("FAIL totals:")


def _native(tmp_path, counts, available=True):
    import json

    path = tmp_path / "native.json"
    doc = (
        {"available": True, "moe_layers": [1, 2], "counts": counts}
        if available
        else {"available": False, "reason": "vLLM-Ascend keeps no moe_load counters on this server"}
    )
    path.write_text(json.dumps(doc))
    return str(path)


def _dump(tmp_path):
    data = np.zeros((2, 3, 4), dtype=np.int64)
    data[0, 1] = [10, 20, 30, 40]
    data[1, 2] = [25, 25, 25, 25]
    return str(write_counts(Counts(data, {"top_k": 1, "moe_layers": [1, 2]}), tmp_path / "d.npz"))


def test_native_passes_when_the_engine_counted_the_same_and_a_little_padding(tmp_path, capsys):
    assert main(["native", _dump(tmp_path), _native(tmp_path, [[10, 20, 30, 41], [25, 25, 25, 25]])]) == 0
    assert capsys.readouterr().out.startswith("PASS dump vs vLLM-Ascend's moe_load")


@pytest.mark.parametrize(
    "theirs, said",
    [([[10, 20, 30, 39], [25, 25, 25, 25]], "above theirs: 1"), ([[10, 20, 30, 40], [25, 25, 25, 90]], "worst share distance")],
    ids=["we-count-more", "shares-differ"],
)
def test_native_fails_when_we_count_more_than_the_engine_or_shares_differ(tmp_path, capsys, theirs, said):
    assert main(["native", _dump(tmp_path), _native(tmp_path, theirs)]) == 1
    assert said in capsys.readouterr().out


def test_native_unavailable_fails_unless_the_operator_waives_it(tmp_path, capsys):
    assert main(["native", _dump(tmp_path), _native(tmp_path, None, available=False)]) == 1
    assert capsys.readouterr().out.startswith("FAIL dump vs vLLM-Ascend's moe_load: vLLM-Ascend keeps no moe_load")
    assert main(["native", _dump(tmp_path), _native(tmp_path, None, available=False), "--waive-unavailable"]) == 0
    assert "(waived by the operator)" in capsys.readouterr().out


def _record(tmp_path, mask_all_real: bool):
    """A dump of three padded passes (MC2 batches of 8 rows, 5, 3 and 6 of them real) through the
    plugin's observer: with the forward context's real-row mask, or with every row marked real."""
    import torch

    from vllm_scene_eplb.runtime.worker.observer import RoutingObserver

    observer = RoutingObserver(2, 8, 4)
    observer.start()
    for real in (5, 3, 6):
        mask = torch.ones(8, dtype=torch.bool) if mask_all_real else torch.arange(8) < real
        for layer in (0, 1):
            observer.capture(layer, torch.randint(0, 8, (8, 2), dtype=torch.int32), own_rows=mask)
        observer.end_step()
    observer.stop()
    counts = torch.zeros((4, 4, 8), dtype=torch.int64)
    counts[: observer.snapshot().logical.shape[0], 1:3] = observer.snapshot().logical
    path = write_counts(Counts(counts.numpy(), {"top_k": 2, "moe_layers": [1, 2]}), tmp_path / "rec.npz")
    (tmp_path / "before.txt").write_text(METRICS.format(a=100.0, b=50.0))
    (tmp_path / "after.txt").write_text(METRICS.format(a=110.0, b=54.0))  # 14 real prompt tokens
    return [str(path), str(tmp_path / "before.txt"), str(tmp_path / "after.txt")]


def test_totals_fail_when_the_mask_marks_every_row_real(tmp_path, capsys):
    """A padded load is what makes totals able to fail: the real-row mask passes, an all-rows-real
    mask counts the padding rows and fails."""
    assert main(["totals", *_record(tmp_path, mask_all_real=False)]) == 0
    capsys.readouterr()
    assert main(["totals", *_record(tmp_path, mask_all_real=True)]) == 1
    assert "off: [(1, 48), (2, 48)]" in capsys.readouterr().out


GRAPH_LOG = """INFO 12-01 10:00:00 [loggers.py:257] **CUDAGraph Config Settings:**

- Mode: FULL_AND_PIECEWISE
- Capture sizes: [1, 2, 4, 8, 16, 24, 32]

**CUDAGraph Stats:**

| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |
|-----------------|---------------|--------------|--------------|-------|
{rows}
"""


def test_graph_passes_on_padded_replays_and_fails_without_replay(tmp_path, capsys):
    log = tmp_path / "d.log"
    log.write_text(GRAPH_LOG.format(rows="| 12 | 16 | 4 | FULL | 120 |\n| 16 | 16 | 0 | FULL | 30 |"))
    assert main(["graph", str(log)]) == 0 and "150 graph passes (120 padded)" in capsys.readouterr().out
    log.write_text(GRAPH_LOG.format(rows="| 12 | 12 | 0 | NONE | 150 |"))  # eager: nothing replayed
    assert main(["graph", str(log)]) == 1 and "no pass replayed a graph" in capsys.readouterr().out
    log.write_text(GRAPH_LOG.format(rows="| 16 | 16 | 0 | FULL | 150 |"))  # replays, never padded
    assert main(["graph", str(log)]) == 1 and "no padded replay" in capsys.readouterr().out
    log.write_text("INFO engine started\n")
    assert main(["graph", str(log)]) == 1 and "--cudagraph-metrics" in capsys.readouterr().out


def test_comm_passes_on_mc2_alone_and_fails_on_the_wrong_comm_method(tmp_path, capsys):
    from vllm_scene_eplb.protocol import COMM_METHOD_LINE

    log = tmp_path / "p.log"
    log.write_text(f"(EngineCore_DP0) INFO {COMM_METHOD_LINE % 'MC2'}\n(EngineCore_DP1) INFO {COMM_METHOD_LINE % 'MC2'}\n")
    assert main(["comm", str(log)]) == 0 and capsys.readouterr().out.startswith("PASS MoE comm method MC2 chosen")
    log.write_text(f"INFO {COMM_METHOD_LINE % 'ALLTOALL'}\n")
    assert main(["comm", str(log)]) == 1 and "real passes ran ALLTOALL" in capsys.readouterr().out
    log.write_text(f"INFO {COMM_METHOD_LINE % 'MC2'}\nINFO {COMM_METHOD_LINE % 'ALLTOALL'}\n")
    assert main(["comm", str(log)]) == 1
    log.write_text("INFO nothing\n")
    assert main(["comm", str(log)]) == 1 and "no MoE comm method" in capsys.readouterr().out


def _result(tmp_path, name, prefill):
    import json

    from vllm_scene_eplb.ab.results import RESULT_FORMAT
    from vllm_scene_eplb.fileio import doc_checksum

    doc = {
        "format": RESULT_FORMAT,
        "manifest": {"scene": {"name": name}},
        "runs": [],
        "aggregate": {"prefill_throughput_per_card": {"mean": prefill, "ci95": None, "n": 1}},
    }
    doc["checksum"] = doc_checksum(doc)
    (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    return str(tmp_path / f"{name}.json")


def test_throughput_ratio_over_rounds_with_its_interval_passes_at_the_ratio_and_fails_below(tmp_path, capsys):
    plain = [_result(tmp_path, f"plain{i}", v) for i, v in enumerate((1000.0, 1100.0, 900.0))]
    idle = [_result(tmp_path, f"idle{i}", v) for i, v in enumerate((985.0, 1085.0, 885.0))]
    assert main(["throughput", "--plain", *plain, "--idle", *idle]) == 0
    out = capsys.readouterr().out
    # Round by round the idle side is 1.5% slower, so the 10% spread between rounds cancels and the
    # interval can tell (the per-side bootstrap this replaced read "spans it" here: it ignored the rounds).
    assert out.startswith("PASS") and "0.9849 [0.98" in out and "over 3 rounds" in out and "lies above it" in out
    assert main(["throughput", "--plain", *plain, "--idle", *idle, "--min-ratio", "0.99"]) == 1
    assert capsys.readouterr().out.startswith("FAIL recorder idle vs flag off")
    noisy = [_result(tmp_path, f"noisy{i}", v) for i, v in enumerate((1000.0, 900.0, 1050.0))]
    assert main(["throughput", "--plain", *plain, "--idle", *noisy]) == 0 and "spans it" in capsys.readouterr().out
    slow = [_result(tmp_path, f"slow{i}", v) for i, v in enumerate((800.0, 805.0, 795.0))]
    steady = [_result(tmp_path, f"steady{i}", v) for i, v in enumerate((1000.0, 1001.0, 999.0))]
    assert main(["throughput", "--plain", *steady, "--idle", *slow]) == 1 and "a real cost" in capsys.readouterr().out
    assert main(["throughput", "--plain", *steady[:2], "--idle", *slow[:2]]) == 1
    assert "2 rounds cannot tell" in capsys.readouterr().out  # two rounds: the ratio, no reading of the interval
    assert main(["throughput", "--plain", plain[0], "--idle", *idle]) == 1
    assert "one of each per round, at least 2 rounds" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [0.0, "NOT_OBSERVED"], ids=["zero", "not-observed"])
def test_throughput_of_a_run_that_served_nothing_is_one_clear_failure(tmp_path, capsys, bad):
    plain = [_result(tmp_path, f"plain{i}", v) for i, v in enumerate((1000.0, 1100.0, 900.0))]
    idle = [_result(tmp_path, f"idle{i}", v) for i, v in enumerate((985.0, bad, 885.0))]
    assert main(["throughput", "--plain", *plain, "--idle", *idle]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL throughput:") and "idle1.json" in out and out.count("\n") == 1 and "nan" not in out


def test_totals_with_decode_count_one_token_per_decode_pass(tmp_path, capsys):
    files = _files(tmp_path, {1: 2 * (100 + 40 - 10), 2: 2 * (100 + 40 - 10)})
    for name, (gen, done) in (("before.txt", (0.0, 0.0)), ("after.txt", (40.0, 10.0))):
        path = tmp_path / name
        path.write_text(
            path.read_text().replace("999.0", str(gen))
            + f'vllm:request_success_total{{engine="0",finished_reason="length"}} {done}\n'
            + 'vllm:num_preemptions_total{engine="0",model_name="m"} 0.0\n'
        )
    assert main(["totals", *files, "--decode"]) == 0
    assert "(100 prompt + 40 generated - 10 requests) tokens" in capsys.readouterr().out
    assert main(["totals", *files]) == 1  # prompt tokens alone: the decode passes are over


def _logged(table: str, pid: int = 7, time: str = "12-02 10:00:10") -> str:
    """``table`` as vLLM 0.23's NewLineFormatter writes one message (its ``_FORMAT`` with the API
    server's process prefix): the first line's prefix repeated after every newline, lines ending "\\r\\n"."""
    prefix = f"(APIServer pid={pid}) INFO {time} [cuda_graph.py:123] "
    return prefix + table.replace("\n", "\r\n" + prefix) + "\n"


def test_graph_reads_rows_behind_vllm_0_23s_log_prefix_and_only_in_the_records_window(tmp_path, capsys):
    """Rows as vLLM 0.23 logs them (each behind the logger's prefix) are read; and only the tables
    between the record's start and stop count: a warm-up table of padded replays before the window
    does not make an eager record pass, the same table inside it does."""
    warm = _logged(GRAPH_LOG.format(rows="| 12 | 16 | 4 | FULL | 120 |"), time="12-02 10:00:00")
    eager = _logged(GRAPH_LOG.format(rows="| 40 | 40 | 0 | NONE | 30 |"), time="12-02 10:00:20")
    log = tmp_path / "d.log"
    log.write_text(warm + eager)
    start = len(warm.encode())
    assert main(["graph", str(log)]) == 0 and "120 graph passes (120 padded) of 150" in capsys.readouterr().out
    assert main(["graph", str(log), "--from-byte", str(start)]) == 1
    assert "0 graph passes (0 padded) of 30" in capsys.readouterr().out
    log.write_text(eager + warm)
    assert main(["graph", str(log), "--from-byte", str(len(eager.encode()))]) == 0
    assert main(["graph", str(log), "--to-byte", str(len(eager.encode()))]) == 1
    capsys.readouterr()
    assert main(["graph", str(log), "--from-byte", str(log.stat().st_size)]) == 1
    assert "no CUDAGraph Stats table in bytes" in capsys.readouterr().out


def test_totals_local_prompt_counts_only_what_the_d_engine_computed_itself(tmp_path, capsys):
    """On a D node whose prompts' KV came from P the engine computes only the last prompt token of each:
    ``--local-prompt`` counts ``prompt_tokens_by_source{source="local_compute"}``, and the full prompt
    count (the pulled tokens included) fails the same dump."""
    files = _files(tmp_path, {1: 2 * (10 + 40 - 10), 2: 2 * (10 + 40 - 10)})
    for name, (local, gen, done) in (("before.txt", (5.0, 0.0, 0.0)), ("after.txt", (15.0, 40.0, 10.0))):
        path = tmp_path / name
        path.write_text(
            path.read_text().replace("999.0", str(gen))
            + f'vllm:request_success_total{{engine="0",finished_reason="length"}} {done}\n'
            + 'vllm:num_preemptions_total{engine="0",model_name="m"} 0.0\n'
            + f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="local_compute"}} {local}\n'
            + 'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 7000.0\n'
        )
    assert main(["totals", *files, "--decode", "--local-prompt"]) == 0
    assert "(10 locally computed prompt + 40 generated - 10 requests) tokens" in capsys.readouterr().out
    assert main(["totals", *files, "--decode"]) == 1  # the 100 prompt tokens, pulled ones included: off


def _page(**values: float) -> str:
    """A D engine's /metrics page (two DP engines where it matters) with the counters ``totals`` reads:
    local prompt, generated, finished by length and by stop, preempted, drafts and accepted drafts."""
    v = {"local": 0.0, "gen": 0.0, "length": 0.0, "stop": 0.0, "preempted": 0.0, **values}
    page = (
        f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {v["local"] + 7000}\n'
        f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="local_compute"}} {v["local"]}\n'
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {v["gen"]}\n'
        f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {v["length"]}\n'
        f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {v["stop"]}\n'
        f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {v["preempted"]}\n'
    )
    if "drafts" in v:  # an engine with a drafter exports these (vLLM 0.23's SpecDecodingProm), per DP engine
        for engine, share in ((0, 0.25), (1, 0.75)):
            page += (
                f'vllm:spec_decode_num_drafts_total{{engine="{engine}",model_name="m"}} {v["drafts"] * share}\n'
                f'vllm:spec_decode_num_draft_tokens_total{{engine="{engine}",model_name="m"}} {v["drafts"] * share}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="{engine}",model_name="m"}} {v["accepted"] * share}\n'
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{engine}",model_name="m",position="0"}} 1e9\n'
            )
    return page


# A D record with MTP 1 of 10 requests: 10 last prompt tokens computed on D, 100 generated, 80 drafts
# verified (10 of them the recompute scheduler's placeholders beside the last prompt tokens), 30
# accepted: (10 + 100 - 10 - 30 + 80) = 150 tokens at least, up to 2 x 1 x 10 more
MTP_BEFORE = {"local": 5.0, "gen": 20.0, "length": 2.0, "drafts": 16.0, "accepted": 4.0}
MTP_AFTER = {"local": 15.0, "gen": 120.0, "length": 12.0, "drafts": 96.0, "accepted": 34.0}


def _mtp(tmp_path, target, drafter=None, before=MTP_BEFORE, after=MTP_AFTER):
    """A decode dump (top-k 2) of target MoE layers 1-3 at ``target`` each (one value, or one a layer),
    with the drafter's row 4 at ``drafter`` where given, and the record's /metrics pages."""
    per_layer = target if isinstance(target, list) else [target] * 3
    data = np.zeros((2, 5 if drafter is not None else 4, 8), dtype=np.int64)
    for layer, total in zip((1, 2, 3), per_layer):
        data[0, layer, 1], data[1, layer, 6] = total - total // 2, total // 2
    meta = {"top_k": 2, "moe_layers": [1, 2, 3]}
    if drafter is not None:
        data[1, 4, 3] = drafter
        meta["drafter_layers"] = [4]
    counts = write_counts(Counts(data, meta), tmp_path / "mtp.npz")
    (tmp_path / "b.txt").write_text(_page(**before))
    (tmp_path / "a.txt").write_text(_page(**after))
    return ["totals", str(counts), str(tmp_path / "b.txt"), str(tmp_path / "a.txt"), "--decode", "--local-prompt"]


def test_totals_with_mtp_count_the_verified_drafts_from_the_engines_counters(tmp_path, capsys):
    """With the drafter on, a decode pass runs its token and the drafts it verifies: the floor is the
    counters' (prompt + generated - requests - accepted + drafts), the ceiling 2K tokens a request
    higher (drafts cut past max_tokens, one async pass of a finished request), every layer the same."""
    for tokens in (150, 161, 170):
        assert main([*_mtp(tmp_path, 2 * tokens), "--spec-tokens", "1"]) == 0, capsys.readouterr().out
        out = capsys.readouterr().out
    assert "(10 locally computed prompt + 100 generated - 10 requests - 30 accepted + 80 drafts) tokens" in out
    assert "within [300, 340], the same each (measured 340)" in out
    assert "the drafter's rows: none in the dump (not counted)" in out


@pytest.mark.parametrize(
    "target, said",
    [
        (2 * 149, "off: [(1, 298), (2, 298), (3, 298)]"),  # below the floor: a token the engine ran was not counted
        (2 * 171, "off: [(1, 342), (2, 342), (3, 342)]"),  # above the ceiling: padding rows counted
        ([310, 312, 310], "off: [(2, 312)]"),  # the layers ran different rows
        (311, "off: [(1, 311), (2, 311), (3, 311)]"),  # not a whole number of tokens x top-k
    ],
)
def test_totals_with_mtp_fail_outside_the_range_or_when_layers_differ(tmp_path, capsys, target, said):
    assert main([*_mtp(tmp_path, target), "--spec-tokens", "1"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL per-layer totals") and said in out


def test_totals_refuse_a_window_the_counters_cannot_account_for(tmp_path, capsys):
    """Drafts verified with no speculative tokens given, speculative tokens given to an engine with no
    drafter, a request finished otherwise than by length (vLLM-Ascend's recompute scheduler hands one
    back to the proxy with "stop") or preempted: each fails in one line that says why."""
    cases = [
        ([], {}, {}, "the engine verified 80 draft tokens: give its speculative tokens (--spec-tokens)"),
        (["--spec-tokens", "1"], {"drafts": None}, {"drafts": None}, "no vllm:spec_decode_num_draft_tokens_total"),
        (["--spec-tokens", "1"], {}, {"stop": 1.0}, "1 requests finished otherwise than by length and 0 were preempted"),
        (["--spec-tokens", "1"], {}, {"preempted": 2.0}, "0 requests finished otherwise than by length and 2 were preempted"),
    ]
    for extra, before, after, said in cases:
        b = {k: v for k, v in {**MTP_BEFORE, **before}.items() if v is not None}
        a = {k: v for k, v in {**MTP_AFTER, **after}.items() if v is not None}
        if "drafts" not in b:
            b.pop("accepted"), a.pop("accepted")
        assert main([*_mtp(tmp_path, 2 * 150, before=b, after=a), *extra]) == 1
        out = capsys.readouterr().out
        assert out.startswith("FAIL totals: ") and said in out, out


def test_totals_check_the_drafters_rows_apart(tmp_path, capsys):
    """The drafter's row runs the target's passes (its rejected drafts left out where its batch is not
    padded) and K - 1 one-row passes more: between (floor - rejected) x top-k and K x the ceiling x top-k.
    It never joins the target's layers; a silent or out-of-range drafter row fails, and so do drafter
    rows where no speculative tokens were given."""
    assert main([*_mtp(tmp_path, 2 * 155, drafter=2 * 140), "--spec-tokens", "1"]) == 0
    assert "the drafter's rows [4] within [200, 340] apart" in capsys.readouterr().out
    for drafter in (0, 198, 342):
        assert main([*_mtp(tmp_path, 2 * 155, drafter=drafter), "--spec-tokens", "1"]) == 1
        assert f"off: [(4, {drafter})]" in capsys.readouterr().out
    assert main([*_mtp(tmp_path, 2 * 155, drafter=2 * 400), "--spec-tokens", "3"]) == 0  # K = 3: up to 3 x 170
    capsys.readouterr()
    prefill = {"local": 0.0, "drafts": 0.0, "accepted": 0.0}  # a P record: no drafts verified, the drafter ran the prompt
    args = _mtp(tmp_path, 2 * 10, drafter=2 * 10, before=prefill, after={**prefill, "local": 10.0})
    args = [a for a in args if a != "--decode"]
    assert main([*args, "--spec-tokens", "1"]) == 0
    assert main(args) == 1
    assert "drafter rows [4] in the dump, yet no speculative tokens given (--spec-tokens)" in capsys.readouterr().out
