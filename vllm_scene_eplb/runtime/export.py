"""Export recorded counts: integer SUM over an existing Gloo (CPU) group, rank 0 writes one file.

Never a device collective: a new HCCL/NCCL communicator for this allocates hundreds of MB per
device and failed in the field. Every rank takes part in every collective, also when its own part
failed, so a failure anywhere becomes an error everywhere, never a hang or a partial file.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..counts import Counts
from ..errors import SceneEplbError
from ..formats import write_counts


def _all_ok(ok: bool, group) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def export_counts(local: torch.Tensor, group, dump_dir: str | Path, meta: dict, expected_shape: tuple[int, int, int]) -> Path:
    """Sum every rank's [T, L, E] counts over ``group`` (Gloo) and have group rank 0 write them.

    ``local`` holds this rank's counts (a rank that must not double-count passes zeros). Returns
    the written path on every rank; raises SceneEplbError on every rank if any rank failed.
    """
    rank = dist.get_rank(group)
    error, counts = None, None
    try:
        cpu = local.detach().to("cpu", torch.int64)
        if tuple(cpu.shape) != tuple(expected_shape):
            raise SceneEplbError(f"rank {rank}: counts buffer has shape {list(cpu.shape)}, expected {list(expected_shape)}")
    except Exception as exc:  # noqa: BLE001 - reported to every rank below
        error, cpu = exc, torch.zeros(expected_shape, dtype=torch.int64)
    if not _all_ok(error is None, group):
        raise SceneEplbError(f"export aborted: {error}" if error else "export aborted: another rank's counts were invalid")
    dist.all_reduce(cpu, op=dist.ReduceOp.SUM, group=group)
    path = Path(dump_dir) / f"counts-{meta.get('role', 'unknown')}-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9:09d}.npz"
    error = None
    if rank == 0:
        try:
            counts = Counts(cpu.numpy(), {**meta, "ranks_summed": dist.get_world_size(group)})
            write_counts(counts, path)
        except Exception as exc:  # noqa: BLE001 - reported to every rank below
            error = exc
    written = [str(path) if error is None else None]
    dist.broadcast_object_list(written, src=dist.get_global_rank(group, 0), group=group)
    if written[0] is None:
        raise SceneEplbError(f"export failed on rank 0: {error}" if error else "export failed on rank 0")
    return Path(written[0])
