"""Export recorded counts: integer SUM over a Gloo (CPU) group of the EP ranks, rank 0 writes one file.

Never a device collective: a new HCCL/NCCL communicator for this allocates hundreds of MB per
device and failed in the field. Never the engine's own groups either, and never inside the step
loop: each export gets a Gloo group of its own (``export_group``, named by the export id, over
the world's existing store), and ``Exporter`` runs it on a thread over a frozen CPU snapshot, so
an engine that waits in an EP collective for a peer keeps stepping while the export waits for
that peer. Every wait has the group's deadline. Every rank takes part in every collective of an
export, also when its own part failed, so a failure anywhere is an error everywhere; a rank that
never joins makes every other rank's export fail at the deadline; no partial file is ever left.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ..counts import Counts
from ..errors import SceneEplbError
from ..formats import write_counts

EXPORT_PREFIX = "scene_eplb/export/"
KEEP_JOBS = 32  # finished exports each rank can still report on


def export_group(export_id: str, rank: int, size: int, timeout_s: float, store=None):
    """A Gloo group of ``size`` ranks for one export alone, rendezvous under ``export_id`` in
    ``store`` (default: the world's store); every wait in it, rendezvous included, ends at ``timeout_s``."""
    store = store if store is not None else dist.distributed_c10d._get_default_store()
    return dist.ProcessGroupGloo(dist.PrefixStore(EXPORT_PREFIX + export_id, store), rank, size,
                                 timedelta(seconds=timeout_s))


def group_maker(rank: int, size: int):
    """``Exporter``'s group maker for a worker at ``rank`` of the ``size`` EP ranks: ``export_group``
    over the world's store."""
    return lambda export_id, timeout_s: export_group(export_id, rank, size, timeout_s)


def _allreduce(group, tensor: torch.Tensor, op) -> None:
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    group.allreduce([tensor], opts).wait()


def _all_ok(group, ok: bool) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    _allreduce(group, flag, dist.ReduceOp.MIN)
    return bool(flag.item())


def export_counts(local: torch.Tensor, group, path: str | Path, meta: dict, expected_shape: tuple[int, int, int],
                  deadline: float | None = None, split: int | None = None) -> Path:
    """Sum every rank's [T, L, E] counts over ``group`` (Gloo) and have group rank 0 write ``path``.

    ``local`` holds this rank's counts (a rank that must not double-count passes zeros); with
    ``split``, its last axis is logical counts [..., :split] then physical slot counts [..., split:],
    summed together and written as ``logical_count`` and ``physical_count``. Rank 0 writes nothing
    after ``deadline`` (wall clock). Returns ``path`` on every rank; raises SceneEplbError on every
    rank if any rank failed.
    """
    rank, size = group.rank(), group.size()
    error = None
    try:
        cpu = local.detach().to("cpu", torch.int64).contiguous()
        if tuple(cpu.shape) != tuple(expected_shape):
            raise SceneEplbError(f"rank {rank}: counts buffer has shape {list(cpu.shape)}, expected {list(expected_shape)}")
    except Exception as exc:  # noqa: BLE001 - reported to every rank below
        error, cpu = exc, torch.zeros(expected_shape, dtype=torch.int64)
    if not _all_ok(group, error is None):
        raise SceneEplbError(f"export aborted: {error}" if error else "export aborted: another rank's counts were invalid")
    _allreduce(group, cpu, dist.ReduceOp.SUM)
    path = Path(path)
    if rank == 0:
        try:
            if deadline is not None and time.time() >= deadline:
                raise SceneEplbError("the export's deadline passed before the write: nothing written")
            summed = cpu.numpy()
            logical, physical = (summed, None) if split is None or split == summed.shape[2] else (summed[..., :split], summed[..., split:])
            write_counts(Counts(logical, {**meta, "ranks_summed": size}, physical=physical), path)
        except Exception as exc:  # noqa: BLE001 - reported to every rank below
            error = exc
    try:
        written = _all_ok(group, error is None)
    except Exception:
        if rank == 0 and error is None:
            path.unlink(missing_ok=True)  # a peer vanished after the write: no file it cannot vouch for
        raise
    if not written:
        raise SceneEplbError(f"export failed on rank 0: {error}" if error else "export failed on rank 0")
    return path


@dataclass
class ExportJob:
    """One export as this rank sees it: running until ``state`` is ``done`` or ``failed``."""

    export_id: str
    path: Path
    started: float
    state: str = "running"
    error: str | None = None
    seconds: float | None = None

    def to_dict(self) -> dict:
        return {"export_id": self.export_id, "state": self.state, "path": str(self.path), "error": self.error,
                "export_seconds": self.seconds}


class Exporter:
    """Runs this rank's part of each export on a thread, one export at a time, off the step loop.

    ``make_group(export_id, timeout_s)`` builds the export's group (``export_group`` with this rank's
    place); ``begin`` returns at once, ``job`` tells how an export stands.
    """

    def __init__(self, make_group):
        self._make_group = make_group
        self._lock = threading.Lock()
        self._jobs: dict[str, ExportJob] = {}
        self._running: str | None = None

    def begin(self, export_id: str, snapshot: torch.Tensor, path: Path, meta: dict, shape: tuple[int, int, int],
              deadline: float, split: int | None = None) -> ExportJob:
        """Start exporting ``snapshot`` (a CPU copy this exporter now owns) as export ``export_id``,
        to be finished by ``deadline`` (wall clock): every wait of it ends there (``split``: see
        ``export_counts``)."""
        with self._lock:
            if export_id in self._jobs:
                raise SceneEplbError(f"export {export_id} was already started on this rank")
            if self._running is not None:
                raise SceneEplbError(f"export {self._running} is still running: wait for it before dumping again")
            while len(self._jobs) >= KEEP_JOBS:  # the oldest finished ones go: a long-lived server keeps a bounded log
                del self._jobs[next(iter(self._jobs))]
            job = self._jobs[export_id] = ExportJob(export_id, path, time.monotonic())
            self._running = export_id
        threading.Thread(target=self._run, args=(job, snapshot, meta, shape, deadline, split), name=f"scene-eplb-export-{export_id}",
                         daemon=True).start()
        return job

    def _run(self, job: ExportJob, snapshot: torch.Tensor, meta: dict, shape, deadline: float, split: int | None) -> None:
        state, error = "done", None
        try:
            group = self._make_group(job.export_id, max(0.1, deadline - time.time()))
            try:
                export_counts(snapshot, group, job.path, meta, shape, deadline, split)
            finally:
                del group  # its Gloo threads end here, before the job reports its end (a process may exit then)
        except Exception as exc:  # noqa: BLE001 - a Gloo timeout or a peer's failure: reported, never raised here
            state, error = "failed", str(exc) if isinstance(exc, SceneEplbError) else f"{type(exc).__name__}: {exc}"
        with self._lock:
            job.error, job.seconds, job.state = error, round(time.monotonic() - job.started, 4), state
            self._running = None

    def job(self, export_id: str) -> ExportJob:
        with self._lock:
            if export_id not in self._jobs:
                raise SceneEplbError(f"no export {export_id} on this rank (its dump request never reached it)")
            return self._jobs[export_id]
