"""Counts export over real Gloo groups: real processes, real torch.distributed, the plugin's own
per-export group over the world's store, run on a thread the way a worker runs it."""

import json
import os
import socket
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vllm_scene_eplb.formats import read_counts

pytestmark = pytest.mark.timed  # asserts on time or waits on a tight deadline: the first lane (tests/conftest.py)

SHAPE = (4, 3, 8)  # ring entries T, layers L, width W
DEADLINE_S = 3.0


def _record(rank: int, scenario: str):
    """Rank ``rank``'s part: entries of value rank + 1 at stamps 10-13 (``offset``: rank 1 at 11-14, as
    when the start request reached its engine a step later), DP signatures of its steps."""
    from vllm_scene_eplb.runtime.worker.export import RankRecord

    stamps = np.arange(10, 14) + (1 if scenario in ("offset", "misaligned") and rank == 1 else 0)
    signature = np.stack([stamps * 7, stamps * 3], axis=1)  # tokens per DP rank: the same for a stamp on every engine
    if scenario == "misaligned" and rank == 1:
        signature = signature[[1, 2, 3, 0]]  # rank 1's entries carry other steps' tokens: not the same steps
    counts = torch.full((4, *SHAPE[1:]), rank + 1, dtype=torch.int64)
    if scenario == "bad_shape" and rank == 1:
        counts = torch.zeros((4, 3, 9), dtype=torch.int64)
    sources = None
    if scenario.startswith("sources"):  # TP ranks of one batch: rank 0 counts it all, each its own rows
        counts = torch.arange(4 * 3 * 8).reshape(4, *SHAPE[1:]) * (1 - rank)
        sources = _own_rows(rank)
        if scenario == "sources_bad" and rank == 1:
            sources = sources + 1  # rows counted twice: the sum over sources is not the batch
    return RankRecord(
        counts, stamps, signature if scenario != "unsigned" else None, passes=4 + rank, steps_per_entry=2, sources=sources
    )


def _own_rows(rank: int) -> torch.Tensor:
    """Rank ``rank``'s share of the batch ``arange(96)`` per entry: rank 0 the even counts' halves."""
    batch = torch.arange(4 * 3 * 8).reshape(4, *SHAPE[1:])
    return batch // 2 if rank == 0 else batch - batch // 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, dump_dir, scenario, out_dir):
    from vllm_scene_eplb.runtime.worker.export import Exporter, export_group

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        exporter = Exporter(lambda export_id, timeout_s: export_group(export_id, rank, 2, timeout_s))
        record = _record(rank, scenario)
        deadline = time.time() + DEADLINE_S
        if scenario in ("absent", "late") and rank == 1:
            time.sleep(DEADLINE_S + 2)  # rank 1 is stuck in a step (or dead) while rank 0 exports
            if scenario == "absent":
                return
        t0 = time.monotonic()
        job = exporter.begin(
            "e1",
            record,
            os.path.join(dump_dir, "counts-e1.npz"),
            {"role": "prefill", "model": "tiny"},
            SHAPE[0],
            SHAPE[1:],
            deadline,
        )
        began_s = time.monotonic() - t0
        while exporter.job("e1").state == "running":
            time.sleep(0.05)
        result = {**job.answer().to_wire(), "began_s": began_s, "waited_s": time.monotonic() - t0}
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(result, fh)
    finally:
        dist.destroy_process_group()


def _run(tmp_path, scenario, dump_dir):
    mp.spawn(_worker, args=(_free_port(), str(dump_dir), scenario, str(tmp_path)), nprocs=2, join=True)
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]


def test_sum_over_gloo_and_rank0_writes_one_verified_file(tmp_path):
    dump = tmp_path / "dumps"
    results = _run(tmp_path, "ok", dump)
    assert [r["state"] for r in results] == ["done", "done"] and results[0]["path"] == results[1]["path"]
    assert all(r["began_s"] < 1.0 for r in results)  # begin() hands the work to a thread and returns
    assert [f.name for f in dump.iterdir()] == ["counts-e1.npz"]
    counts = read_counts(results[0]["path"])
    assert (counts.data == 3).all() and counts.data.shape == SHAPE  # 1 + 2, summed exactly once
    assert counts.meta["ranks_summed"] == 2 and counts.meta["role"] == "prefill"
    assert counts.meta["entry_steps"] == [20, 22, 24, 26] and counts.meta["steps_per_entry"] == 2
    assert counts.meta["passes_per_rank"] == [4, 5] and counts.meta["aligned_by"] == "stamps and DP signatures"


def test_entries_line_up_by_stamp_not_by_ring_position(tmp_path):
    """Rank 1 began a step later: entry by entry the sum is of the same steps; the window is the last
    T stamps any rank holds (stamp 10, rank 0's oldest, falls out), and every count is placed once."""
    results = _run(tmp_path, "offset", tmp_path / "dumps")
    assert [r["state"] for r in results] == ["done", "done"]
    counts = read_counts(results[0]["path"])
    assert counts.meta["entry_steps"] == [22, 24, 26, 28]
    assert counts.data.sum(axis=(1, 2)).tolist() == [3 * 24, 3 * 24, 3 * 24, 2 * 24]  # 11-13 both ranks, 14 rank 1 only


def test_entries_that_do_not_line_up_fail_every_rank_and_write_nothing(tmp_path):
    """The same stamps with different DP signatures are not the same steps: placed by stamp alone they
    would sum different moments, so the export refuses."""
    dump = tmp_path / "dumps"
    results = _run(tmp_path, "misaligned", dump)
    assert [r["state"] for r in results] == ["failed", "failed"]
    assert all("do not line up across DP engines" in r["error"] and "global step 22" in r["error"] for r in results)
    assert not dump.exists() or not list(dump.iterdir())


def test_without_signatures_the_stamps_alone_line_up(tmp_path):
    results = _run(tmp_path, "unsigned", tmp_path / "dumps")
    assert read_counts(results[0]["path"]).meta["aligned_by"] == "stamps"


def test_a_bad_rank_fails_every_rank_and_writes_nothing(tmp_path):
    dump = tmp_path / "dumps"
    results = _run(tmp_path, "bad_shape", dump)
    assert [r["state"] for r in results] == ["failed", "failed"]
    assert "rank 1" in results[1]["error"] and "another rank" in results[0]["error"]
    assert not dump.exists() or not list(dump.iterdir())


def test_a_failed_write_on_rank0_is_an_error_everywhere(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    results = _run(tmp_path, "ok", blocker / "sub")
    assert all(r["state"] == "failed" and "rank 0" in r["error"] for r in results)


def test_a_rank_that_never_joins_fails_the_export_at_the_deadline(tmp_path):
    dump = tmp_path / "dumps"
    results = _run(tmp_path, "absent", dump)
    assert len(results) == 1 and results[0]["state"] == "failed"
    assert DEADLINE_S - 0.5 <= results[0]["waited_s"] <= DEADLINE_S + 5  # an error at the deadline, not a hang
    assert not dump.exists() or not list(dump.iterdir())


def test_a_rank_that_joins_after_the_deadline_fails_too_and_nothing_is_written(tmp_path):
    dump = tmp_path / "dumps"
    results = _run(tmp_path, "late", dump)
    assert [r["state"] for r in results] == ["failed", "failed"]
    assert not dump.exists() or not list(dump.iterdir())


def test_each_ranks_own_rows_are_summed_over_the_window_into_its_source_row(tmp_path):
    """Rank 0 counts the whole batch (TP rank 0), each rank the rows it routes itself: ``source_count``
    row r is rank r's own rows summed over the window's entries, and the rows add up to the counts."""
    results = _run(tmp_path, "sources", tmp_path / "dumps")
    assert [r["state"] for r in results] == ["done", "done"]
    counts = read_counts(results[0]["path"])
    assert counts.sources is not None and counts.sources.shape == (2, *SHAPE[1:])
    assert counts.sources[0].tolist() == _own_rows(0).sum(dim=0).tolist()
    assert counts.sources[1].tolist() == _own_rows(1).sum(dim=0).tolist()
    assert np.array_equal(counts.sources.sum(axis=0), counts.data.sum(axis=0))
    assert counts.meta["source_shape"] == [2, *SHAPE[1:]]


def test_own_rows_that_do_not_add_up_to_the_counts_fail_every_rank_and_write_nothing(tmp_path):
    dump = tmp_path / "dumps"
    results = _run(tmp_path, "sources_bad", dump)
    assert [r["state"] for r in results] == ["failed", "failed"]
    assert "source_count holds" in results[0]["error"] and "failed on rank 0" in results[1]["error"], results
    assert not dump.exists() or not list(dump.iterdir())
