"""Export recorded counts: integer SUM over a Gloo (CPU) group of the EP ranks, rank 0 writes one file.

Never a device collective: a new HCCL/NCCL communicator for this allocates hundreds of MB per
device and failed in the field. Never the engine's own groups either, and never inside the step
loop: each export gets a Gloo group of its own (``export_group``, named by the export id, over
the world's existing store), and ``Exporter`` runs it on a thread over a frozen CPU snapshot, so
an engine that waits in an EP collective for a peer keeps stepping while the export waits for
that peer. Every wait has the group's deadline. Every rank takes part in every collective of an
export, also when its own part failed, so a failure anywhere is an error everywhere; a rank that
never joins makes every other rank's export fail at the deadline; no partial file is ever left.

Ranks line their ring entries up by stamp (see ``observer``): the export agrees on the window of
stamps all ranks recorded (the last T of them), places each rank's entries there, and where the
ranks carry DP signatures, refuses entries whose signatures differ between ranks (not the same steps).
Where every rank carries the counts of the rows it routes itself, their sums over the window's
entries go to the rank's row of ``source_count`` [S, L, E] (S = the group's ranks).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ...errors import SceneEplbError
from ...formats import write_counts
from ...layouts.counts import Counts
from ...protocol import ExportJobAnswer

EXPORT_PREFIX = "scene_eplb/export/"
KEEP_JOBS = 32  # finished exports each rank can still report on
_NONE = np.iinfo(np.int64).max  # "no entry here" in MIN reductions


@dataclass(frozen=True)
class RankRecord:
    """One rank's part of an export: its entries [n, L, W] (int64 CPU; zeros on a rank that must not
    double-count), their stamps [n] (ascending), DP signatures [n, DP] (None: not reported), the
    real passes it recorded and their scheduled tokens."""

    counts: torch.Tensor
    stamps: np.ndarray
    signature: np.ndarray | None
    passes: int
    steps_per_entry: int = 1
    tokens: int = 0  # scheduled tokens of the recorded passes (0 on a rank whose tokens another rank reports)
    sources: torch.Tensor | None = None  # [n, L, E]: its own rows' logical counts per entry (every rank)


def export_group(export_id: str, rank: int, size: int, timeout_s: float, store=None):
    """A Gloo group of ``size`` ranks for one export alone, rendezvous under ``export_id`` in
    ``store`` (default: the world's store); every wait in it, rendezvous included, ends at ``timeout_s``."""
    store = store if store is not None else dist.distributed_c10d._get_default_store()
    return dist.ProcessGroupGloo(dist.PrefixStore(EXPORT_PREFIX + export_id, store), rank, size, timedelta(seconds=timeout_s))


def group_maker(rank: int, size: int):
    """``Exporter``'s group maker for a worker at ``rank`` of the ``size`` EP ranks: ``export_group``
    over the world's store."""
    return lambda export_id, timeout_s: export_group(export_id, rank, size, timeout_s)


def allreduce(group, tensor: torch.Tensor, op) -> None:
    """One allreduce of ``tensor`` in place over ``group`` (waits: the group carries the deadline)."""
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    group.allreduce([tensor], opts).wait()


def _all_ok(group, ok: bool) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    allreduce(group, flag, dist.ReduceOp.MIN)
    return bool(flag.item())


def _window(group, stamps: np.ndarray, entries: int) -> tuple[int, int] | None:
    """The stamps [first, last] every rank's entries fall in, the last ``entries`` of them; None: no entry anywhere."""
    bounds = torch.tensor([int(stamps[0]) if stamps.size else _NONE, -int(stamps[-1]) if stamps.size else _NONE])
    allreduce(group, bounds, dist.ReduceOp.MIN)
    if bounds[0] == _NONE:
        return None
    last = -int(bounds[1])
    return max(int(bounds[0]), last - entries + 1), last


def _check_aligned(group, record: RankRecord, first: int, entries: int) -> bool:
    """Raise (on every rank alike) when two ranks' DP signatures of one entry differ; False when not
    every rank has signatures (nothing to compare)."""
    signature = record.signature
    has = torch.tensor([1 if signature is not None else 0], dtype=torch.int64)
    allreduce(group, has, dist.ReduceOp.MIN)
    if not has.item() or signature is None:  # the second: only for the type checker, every rank has one here
        return False
    width = torch.tensor([signature.shape[1]], dtype=torch.int64)
    allreduce(group, width, dist.ReduceOp.MAX)
    low = torch.full((entries, int(width)), _NONE, dtype=torch.int64)
    high = torch.full((entries, int(width)), -1, dtype=torch.int64)
    at = record.stamps - first
    keep = (at >= 0) & (at < entries)
    if signature.shape[1] == int(width):
        low[at[keep]] = high[at[keep]] = torch.from_numpy(signature[keep])
    allreduce(group, low, dist.ReduceOp.MIN)
    allreduce(group, high, dist.ReduceOp.MAX)
    seen = high >= 0
    differ = (seen & (low != high)).any(dim=1).nonzero().flatten().tolist()
    if differ:
        i = differ[0]
        raise SceneEplbError(
            f"ring entries do not line up across DP engines: {len(differ)} entries differ, the first at global "
            f"step {(first + i) * record.steps_per_entry} (tokens per DP rank {low[i].tolist()} on one rank, "
            f"{high[i].tolist()} on another); nothing written"
        )
    return True


def _sum_sources(group, record: RankRecord, keep: np.ndarray, shape: tuple[int, int]) -> np.ndarray | None:
    """Every rank's own-row counts of the window's entries (``keep``: its entries there), summed
    over them into its row of [S, L, E]; None (on every rank alike) unless every rank has them."""
    has = torch.tensor([1 if record.sources is not None else 0], dtype=torch.int64)
    allreduce(group, has, dist.ReduceOp.MIN)
    if not has.item() or record.sources is None:  # the second: only for the type checker
        return None
    sources = record.sources.detach().to("cpu", torch.int64)
    out = torch.zeros((group.size(), shape[0], sources.shape[2]), dtype=torch.int64)
    out[group.rank()] = sources[torch.from_numpy(keep)].sum(dim=0)
    allreduce(group, out, dist.ReduceOp.SUM)
    return out.numpy()


def export_counts(
    record: RankRecord,
    group,
    path: str | Path,
    meta: dict,
    entries: int,
    shape: tuple[int, int],
    deadline: float | None = None,
    split: int | None = None,
) -> Path:
    """Line every rank's entries up by stamp, sum them over ``group`` (Gloo) into [entries, L, W] and
    have group rank 0 write ``path``.

    ``shape`` is (L, W); with ``split``, W is logical counts [..., :split] then physical slot counts
    [..., split:], written as ``logical_count`` and ``physical_count``; the ranks' own-row counts
    (``RankRecord.sources``, where every rank has them) as ``source_count``. The file's entries are the
    window's, oldest first (zeros after its end); its metadata gains each entry's first global step
    (``entry_steps``), ``steps_per_entry``, every rank's real passes (``passes_per_rank``), the
    engine's scheduled tokens over the record (``scheduled_tokens``: the tokens its model ran, drafts
    included, for the per-layer totals to equal x top-k) and what lined the ranks up (``aligned_by``). Rank 0
    writes nothing after ``deadline`` (wall clock). Returns ``path`` on every rank; raises
    SceneEplbError on every rank if any rank failed or the ranks' entries do not line up.
    """
    rank, size = group.rank(), group.size()
    error = None
    try:
        cpu = record.counts.detach().to("cpu", torch.int64).contiguous()
        if tuple(cpu.shape[1:]) != tuple(shape) or cpu.shape[0] != record.stamps.size or np.any(np.diff(record.stamps) <= 0):
            raise SceneEplbError(
                f"rank {rank}: counts buffer {list(cpu.shape)} with {record.stamps.size} ascending stamps "
                f"expected, [n, {shape[0]}, {shape[1]}]"
            )
        logical_width = shape[1] if split is None else split
        if record.sources is not None and tuple(record.sources.shape) != (cpu.shape[0], shape[0], logical_width):
            raise SceneEplbError(
                f"rank {rank}: own-row counts {list(record.sources.shape)} expected, [{cpu.shape[0]}, {shape[0]}, {logical_width}]"
            )
    except Exception as exc:  # noqa: BLE001 - reported to every rank below
        error = exc
        record = RankRecord(torch.zeros((0, *shape), dtype=torch.int64), np.zeros(0, dtype=np.int64), None, 0)
        cpu = record.counts
    if not _all_ok(group, error is None):
        raise SceneEplbError(f"export aborted: {error}" if error else "export aborted: another rank's counts were invalid")
    window = _window(group, record.stamps, entries)
    summed = torch.zeros((entries, *shape), dtype=torch.int64)
    first, span = (window[0], window[1] - window[0] + 1) if window else (0, 0)
    checked = _check_aligned(group, record, first, entries)
    at = record.stamps - first
    keep = np.flatnonzero((at >= 0) & (at < span))
    summed[torch.from_numpy(at[keep])] = cpu[torch.from_numpy(keep)]
    allreduce(group, summed, dist.ReduceOp.SUM)
    sources = _sum_sources(group, record, keep, shape)
    per_rank = torch.zeros((2, size), dtype=torch.int64)  # real passes, scheduled tokens
    per_rank[:, rank] = torch.tensor([record.passes, record.tokens])
    allreduce(group, per_rank, dist.ReduceOp.SUM)
    path = Path(path)
    if rank == 0:
        try:
            if deadline is not None and time.time() >= deadline:
                raise SceneEplbError("the export's deadline passed before the write: nothing written")
            data = summed.numpy()
            logical, physical = (
                (data, None) if split is None or split == data.shape[2] else (data[..., :split], data[..., split:])
            )
            extra = {
                "ranks_summed": size,
                "steps_per_entry": record.steps_per_entry,
                "passes_per_rank": per_rank[0].tolist(),
                "scheduled_tokens": int(per_rank[1].sum()),
                "entry_steps": [(first + i) * record.steps_per_entry for i in range(span)],
                "aligned_by": "stamps and DP signatures" if checked else "stamps",
            }
            write_counts(Counts(logical, {**meta, **extra}, physical=physical, sources=sources), path)
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

    def answer(self) -> ExportJobAnswer:
        """How this job stands, as this rank answers ``EXPORT_STATUS_ACTION``."""
        return ExportJobAnswer(self.export_id, self.state, str(self.path), self.error, self.seconds)


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

    def begin(
        self,
        export_id: str,
        record: RankRecord,
        path: Path,
        meta: dict,
        entries: int,
        shape: tuple[int, int],
        deadline: float,
        split: int | None = None,
    ) -> ExportJob:
        """Start exporting ``record`` (CPU copies this exporter now owns) as export ``export_id``,
        to be finished by ``deadline`` (wall clock): every wait of it ends there (``entries``,
        ``shape``, ``split``: see ``export_counts``)."""
        with self._lock:
            if export_id in self._jobs:
                raise SceneEplbError(f"export {export_id} was already started on this rank")
            if self._running is not None:
                raise SceneEplbError(f"export {self._running} is still running: wait for it before dumping again")
            while len(self._jobs) >= KEEP_JOBS:  # the oldest finished ones go: a long-lived server keeps a bounded log
                del self._jobs[next(iter(self._jobs))]
            job = self._jobs[export_id] = ExportJob(export_id, path, time.monotonic())
            self._running = export_id
        threading.Thread(
            target=self._run,
            args=(job, record, meta, entries, shape, deadline, split),
            name=f"scene-eplb-export-{export_id}",
            daemon=True,
        ).start()
        return job

    def _run(
        self, job: ExportJob, record: RankRecord, meta: dict, entries: int, shape, deadline: float, split: int | None
    ) -> None:
        state, error = "done", None
        try:
            group = self._make_group(job.export_id, max(0.1, deadline - time.time()))
            try:
                export_counts(record, group, job.path, meta, entries, shape, deadline, split)
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
