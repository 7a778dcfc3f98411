"""Counts export over a real Gloo group: two real processes, real torch.distributed."""

import json
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vllm_scene_eplb.formats import read_counts

SHAPE = (4, 3, 8)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, dump_dir, scenario, out_dir):
    from vllm_scene_eplb.errors import SceneEplbError
    from vllm_scene_eplb.runtime.export import export_counts

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        group = dist.new_group([0, 1], backend="gloo")
        local = torch.full(SHAPE, rank + 1, dtype=torch.int32)
        if scenario == "bad_shape" and rank == 1:
            local = torch.zeros((4, 3, 9), dtype=torch.int32)
        try:
            path = export_counts(local, group, dump_dir, {"role": "prefill", "model": "tiny"}, SHAPE)
            result = {"path": str(path)}
        except SceneEplbError as exc:
            result = {"error": str(exc)}
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(result, fh)
    finally:
        dist.destroy_process_group()


def _run(tmp_path, scenario, dump_dir):
    mp.spawn(_worker, args=(_free_port(), str(dump_dir), scenario, str(tmp_path)), nprocs=2, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_sum_over_gloo_and_rank0_writes_one_verified_file(tmp_path):
    dump = tmp_path / "dumps"
    results = _run(tmp_path, "ok", dump)
    assert results[0] == results[1] and "path" in results[0]
    files = list(dump.iterdir())
    assert len(files) == 1
    counts = read_counts(results[0]["path"])
    assert (counts.data == 3).all() and counts.data.shape == SHAPE  # 1 + 2, summed exactly once
    assert counts.meta["ranks_summed"] == 2 and counts.meta["role"] == "prefill"


def test_a_bad_rank_fails_every_rank_and_writes_nothing(tmp_path):
    dump = tmp_path / "dumps"
    results = _run(tmp_path, "bad_shape", dump)
    assert all("error" in r for r in results)
    assert "rank 1" in results[1]["error"] and "another rank" in results[0]["error"]
    assert not dump.exists() or not list(dump.iterdir())


def test_a_failed_write_on_rank0_is_an_error_everywhere(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    results = _run(tmp_path, "ok", blocker / "sub")
    assert all("error" in r and "rank 0" in r["error"] for r in results)
