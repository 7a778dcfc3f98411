"""The API server's calls to every worker, for any engine: one control action on every worker of
every DP engine, each answer read as its typed payload (``protocol.WorkerAnswer``), and the routes'
answers built from them (status over ranks, the dump, the engine's own counters).

A worker answers between its own steps and never waits for a peer, so no call can hold an engine
inside a collective: ``dump`` starts the export on every rank (each rank's part runs on a thread
over its own Gloo group) and then polls the ranks until all are done or one failed, within the
export deadline (``scene_eplb.export_timeout_s``) plus a margin. Every wait has a deadline; an
engine that does not answer in time is a 504 naming the action, misuse a 409, a failed export or a
broken answer a 500 with every rank's reason (``RouteError``), and the server keeps serving. The
dump path is chosen by the workers inside the configured ``dump_dir``; a request cannot name one.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np

from ...errors import SceneEplbError
from ...protocol import (
    EXPORT_STATUS_ACTION,
    KEEP_SKIPPED,
    NATIVE_ACTION,
    DumpAnswer,
    DumpStarted,
    ExportJobAnswer,
    LiveAnswer,
    NativeLoadAnswer,
    RankNativeLoad,
    StatusAnswer,
    WireObject,
    WorkerAnswer,
    WorkerStatus,
)

CONTROL = "scene_eplb_control"  # the worker method every engine adapter's collective_rpc calls
CALL_TIMEOUT_S = 60.0  # one control call: a worker answers between two steps
DUMP_MARGIN_S = 15.0  # beyond the export deadline, for the ranks to report
POLL_S = (0.1, 1.0)  # first and longest pause between polls of the ranks (doubling): each poll is a call to every worker

P = TypeVar("P", bound=WireObject)


class RouteError(Exception):
    """An answer other than 200: its HTTP status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class WorkerFanout:
    """Control actions on every worker behind one API server. ``call_every_worker(args)`` runs
    ``scene_eplb_control(*args)`` on every worker of every engine and returns the answers, flat
    (the engine adapter's; it never passes a timeout to the engine: see ``workers``)."""

    def __init__(self, call_every_worker: Callable[[tuple], Awaitable[list]]):
        self.call_every_worker = call_every_worker
        # Control requests reach every DP engine one after the other; two interleaved ones could land
        # in different orders on different engines (start, stop on one; stop, start on another). So
        # this server sends one control fan-out at a time, and runs one dump at a time.
        self.control = asyncio.Lock()
        self._dumping = False

    async def workers(self, action: str, *args, timeout: float = CALL_TIMEOUT_S) -> list[Any]:
        """Every worker's answer as it crossed (``WorkerAnswer.to_wire``), across every DP engine
        (each engine core runs collective_rpc on its own workers); RouteError when an engine does
        not answer within ``timeout``.

        The deadline is kept here, by no longer waiting, never by the engine: a collective_rpc that
        times out inside vLLM's multiprocess executor leaves the worker's late answer in its queue,
        where the engine core then reads it as a step's output and dies."""
        try:
            results = await asyncio.wait_for(self.call_every_worker((action, *args)), timeout)
        except asyncio.TimeoutError:
            raise RouteError(
                504,
                f"{action}: not every engine answered within {timeout:.0f} s (an engine is stuck or "
                "gone); the server keeps serving",
            ) from None
        except Exception as exc:  # noqa: BLE001 - the engine answered with an error; keep serving
            raise RouteError(500, f"{action} failed in the engine: {exc}") from None
        if not results:
            raise RouteError(500, f"unexpected worker answer {results!r}")
        return results

    async def all_ok(self, action: str, read: Callable[[Any, str | None], P], *args, timeout: float = CALL_TIMEOUT_S) -> list[P]:
        """Every worker's payload, read with ``read``, when all succeeded; else the first refusal
        (the same on every rank). A broken answer is a 500 naming its field."""
        try:
            answers = [
                WorkerAnswer.from_wire(r, read, f"{action} on a worker")
                for r in await self.workers(action, *args, timeout=timeout)
            ]
        except SceneEplbError as exc:
            raise RouteError(500, f"unexpected worker answer: {exc}") from None
        refused = [a for a in answers if a.payload is None]
        if refused:
            errors = sorted({str(a.error) for a in refused})
            partial = (
                f" ({len(answers) - len(refused)} of {len(answers)} ranks accepted it)" if len(refused) < len(answers) else ""
            )
            raise RouteError(refused[0].http_status, "; ".join(errors) + partial)
        return [a.payload for a in answers if a.payload is not None]

    async def statuses(self, timeout: float = CALL_TIMEOUT_S) -> list[WorkerStatus]:
        """Every worker's status."""
        return await self.all_ok("status", WorkerStatus.from_wire, timeout=timeout)

    async def status(self, action: str, live: LiveAnswer | None) -> StatusAnswer:
        """``action`` (status, start or stop) on every worker, answered as the status over ranks with ``live``."""
        if action == "status":
            return StatusAnswer.of_ranks(await self.statuses(), live)
        async with self.control:
            return StatusAnswer.of_ranks(await self.all_ok(action, WorkerStatus.from_wire), live)

    async def dump(self, keep_skipped: bool, export_s: float) -> DumpAnswer:
        """Start the export on every rank, then poll until every rank is done, one failed, or the
        deadline (``export_s`` plus a margin). One dump at a time. A record in which a rank skipped
        passes (rows it could not attribute) undercounts: refused unless ``keep_skipped``, and then
        its metadata says how many."""
        if self._dumping:
            raise RouteError(409, "a dump is already running on this server: wait for its answer before dumping again")
        self._dumping = True
        try:
            return await self._dump(keep_skipped, export_s)
        finally:
            self._dumping = False

    async def _dump(self, keep_skipped: bool, export_s: float) -> DumpAnswer:
        export_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
        timeout = export_s + DUMP_MARGIN_S
        deadline = time.monotonic() + timeout
        # Every rank gets the export's wall-clock deadline: a rank that receives the request late (its
        # engine was stuck) starts nothing, and no rank writes after it, so a 504 leaves no file behind.
        async with self.control:
            statuses = await self.statuses(timeout=min(CALL_TIMEOUT_S, timeout))
            skipped = sum(st.skipped_recorded for st in statuses)
            if skipped and not keep_skipped:
                raise RouteError(
                    409,
                    f"this record skipped {skipped} (MoE layer, pass) pairs: rows a rank could not attribute "
                    "to its own tokens were not counted (the workers' log says why), so the dump would "
                    f"undercount; dump with ?{KEEP_SKIPPED}=true to write it anyway (its metadata says so)",
                )
            started = await self.all_ok(
                "dump",
                DumpStarted.from_wire,
                export_id,
                time.time() + export_s,
                skipped,
                timeout=max(0.1, min(CALL_TIMEOUT_S, deadline - time.monotonic())),
            )
        pause = POLL_S[0]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RouteError(
                    504,
                    f"dump {export_id}: not every rank finished its export within {timeout:.0f} s; "
                    "no rank writes after the export's deadline; the server keeps serving",
                )
            jobs = await self.all_ok(EXPORT_STATUS_ACTION, ExportJobAnswer.from_wire, export_id, timeout=left)
            failed = sorted({str(j.error) for j in jobs if j.state == "failed"})
            if failed:
                raise RouteError(500, f"dump {export_id} failed: {'; '.join(failed)}; no file was written")
            if all(j.state == "done" for j in jobs):
                return DumpAnswer.of_ranks(started, jobs)
            await asyncio.sleep(min(pause, max(left, 0)))
            pause = min(2 * pause, POLL_S[1])

    async def native(self) -> NativeLoadAnswer:
        """Every rank's logical counts from the engine's own counters, summed; the first reason if a rank has none."""
        answers = sorted(await self.all_ok(NATIVE_ACTION, RankNativeLoad.from_wire), key=lambda a: a.ep_rank)
        missing = [a.load.reason for a in answers if not a.load.available]
        if missing:
            return NativeLoadAnswer(False, len(answers), reason=missing[0])
        total = np.sum([np.asarray(a.load.counts, dtype=np.int64) for a in answers], axis=0)
        return NativeLoadAnswer(True, len(answers), moe_layers=answers[0].moe_layers, counts=tuple(map(tuple, total.tolist())))
