"""The recorder's HTTP routes at SGLang's names, plus status (the paths are in ``protocol.ROUTES``),
for any engine: an adapter subclasses ``SceneEplbEndpoints`` with how its API server reaches every
worker, checks its version and verifies API keys, and attaches it to its server.

Each route calls ``scene_eplb_control`` on every worker of every DP engine (collective_rpc through
each engine core) and answers for all of them: ``status`` is EP rank 0's status plus every rank's
view and whether they agree (``protocol.aggregate_status``). A worker answers between its own
steps and never waits for a peer, so no route can hold an engine inside a collective: ``dump``
starts the export on every rank (each rank's part runs on a thread over its own Gloo group) and
then polls the ranks until all are done or one failed, within the export deadline
(``scene_eplb.export_timeout_s``) plus a margin. Every wait has a deadline; an engine that does
not answer in time is a 504 naming the action, misuse a 409, a failed export a 500 with every
rank's reason, and in every case the server keeps serving. The dump path is chosen by the workers
inside the configured ``dump_dir``; a request cannot name one. The routes honour ``--api-key`` /
``VLLM_API_KEY`` (vLLM's own middleware guards only /v1-style paths).

Live fitness: with the flag on, a background task reads every rank's cumulative live counts each
``live_window_s``, sums the ranks that count each token once, scores the window with the loaded
layout and dispatch (``fitness.LiveFitness``), logs the drift alarm's changes, sets the gauges on
``/metrics`` (``metrics``) and answers the status route's ``live`` object.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from argparse import Namespace
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..config import PluginConfig, parse_config
from ..errors import SceneEplbError
from ..fitness import LiveFitness, LiveSample
from ..formats import GeometryHint, read_layout
from ..measured import RankTime, SourceTraffic
from ..protocol import (
    EXPORT_STATUS_ACTION,
    KEEP_SKIPPED,
    LIVE_ACTION,
    LIVE_KEY,
    NATIVE_ACTION,
    PROVENANCE_KEYS,
    ROUTES,
    DumpAnswer,
    NativeLoadAnswer,
    aggregate_status,
)
from . import metrics

logger = logging.getLogger("vllm.scene_eplb")

CONTROL = "scene_eplb_control"
CALL_TIMEOUT_S = 60.0  # one control call: a worker answers between two steps
DUMP_MARGIN_S = 15.0  # beyond the export deadline, for the ranks to report
POLL_S = (0.1, 1.0)  # first and longest pause between polls of the ranks (doubling): each poll is a call to every worker


class RouteError(Exception):
    """An answer other than 200: its HTTP status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class SceneEplbEndpoints:
    """The routes and the live-fitness poller of one API server process. An engine adapter subclass
    supplies ``check_version``, ``call_every_worker`` and ``api_key_verifier``."""

    name = "scene_eplb"
    required_tasks = None

    def __init__(self) -> None:
        self.engine_client: Any = None  # the engine's client (vLLM's AsyncLLM), set by init_state
        self.verifier: Any = None
        self.config: PluginConfig | None = None
        self.live: LiveFitness | None = None
        self._live_task: asyncio.Task | None = None
        # Control requests reach every DP engine one after the other; two interleaved ones could land
        # in different orders on different engines (start, stop on one; stop, start on another). So
        # this server sends one control fan-out at a time, and runs one dump at a time.
        self._control = asyncio.Lock()
        self._dumping = False

    def attach_router(self, app: FastAPI) -> None:
        for route in ROUTES:
            app.add_api_route(route.path, self._handler(route.action), methods=["GET", "POST"], name=f"scene_eplb_{route.action}")

    async def init_state(self, engine_client, state, args: Namespace) -> None:
        raw = getattr(args, "additional_config", None)
        if isinstance(raw, str):
            raw = json.loads(raw) if raw else None
        self.config = parse_config(raw)
        if self.config is not None:
            self.check_version()  # refuse to serve with an adapter written for another engine release
        self.engine_client = engine_client
        if self.config is not None and self.config.live_counts:
            self._live_task = asyncio.get_running_loop().create_task(self._live_loop(), name="scene-eplb-live")
        tokens = [k for k in (getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]) if k]
        if tokens:
            self.verifier = self.api_key_verifier(tokens)

    # ------------------------------------------------------------ what an engine adapter supplies

    def check_version(self) -> None:
        """Raise SceneEplbError when the engine is not the release the adapter was written for."""
        raise NotImplementedError

    def api_key_verifier(self, tokens: list[str]):
        """The engine's API-key check: an object whose ``verify_token(headers)`` says yes or no."""
        raise NotImplementedError

    async def call_every_worker(self, args: tuple) -> list:
        """``scene_eplb_control(*args)`` on every worker of every engine behind this server: the
        answers, flat. Never passes a timeout to the engine (see ``_workers``)."""
        raise NotImplementedError

    # ------------------------------------------------------------ calls to every worker

    async def _workers(self, action: str, *args, timeout: float = CALL_TIMEOUT_S) -> list[dict]:
        """Every worker's answer, across every DP engine (each engine core runs collective_rpc on its
        own workers); RouteError when an engine does not answer within ``timeout``.

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
        if not results or not all(isinstance(r, dict) for r in results):
            raise RouteError(500, f"unexpected worker answer {results!r}")
        return results

    async def _all_ok(self, action: str, *args, timeout: float = CALL_TIMEOUT_S) -> list[dict]:
        """Every worker's answer when all succeeded; else the first refusal (the same on every rank)."""
        results = await self._workers(action, *args, timeout=timeout)
        refused = [r for r in results if not r.get("ok")]
        if refused:
            errors = sorted({str(r.get("error")) for r in refused})
            partial = (
                f" ({len(results) - len(refused)} of {len(results)} ranks accepted it)" if len(refused) < len(results) else ""
            )
            raise RouteError(refused[0].get("http_status", 409), "; ".join(errors) + partial)
        return [{k: v for k, v in r.items() if k != "ok"} for r in results]

    async def _dump(self, keep_skipped: bool) -> dict:
        """Start the export on every rank, then poll until every rank is done, one failed, or the deadline.
        A record in which a rank skipped passes (rows it could not attribute) undercounts: refused
        unless ``keep_skipped``, and then its metadata says how many."""
        export_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
        export_s = self.config.export_timeout_s if self.config else PluginConfig.export_timeout_s
        timeout = export_s + DUMP_MARGIN_S
        deadline = time.monotonic() + timeout
        # Every rank gets the export's wall-clock deadline: a rank that receives the request late (its
        # engine was stuck) starts nothing, and no rank writes after it, so a 504 leaves no file behind.
        async with self._control:
            answers = await self._all_ok("status", timeout=min(CALL_TIMEOUT_S, timeout))
            skipped = sum(st.get("skipped_recorded", 0) for st in answers)
            if skipped and not keep_skipped:
                raise RouteError(
                    409,
                    f"this record skipped {skipped} (MoE layer, pass) pairs: rows a rank could not attribute "
                    "to its own tokens were not counted (the workers' log says why), so the dump would "
                    f"undercount; dump with ?{KEEP_SKIPPED}=true to write it anyway (its metadata says so)",
                )
            started = await self._all_ok(
                "dump",
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
            jobs = await self._all_ok(EXPORT_STATUS_ACTION, export_id, timeout=left)
            failed = sorted({j["error"] for j in jobs if j["state"] == "failed"})
            if failed:
                raise RouteError(500, f"dump {export_id} failed: {'; '.join(failed)}; no file was written")
            if all(j["state"] == "done" for j in jobs):
                first = min(started, key=lambda r: r.get("ep_rank", 0))
                return DumpAnswer(
                    **{
                        **first,
                        "state": "done",
                        "ranks": len(jobs),
                        "export_seconds": max(j["export_seconds"] for j in jobs),
                        "local_total": sum(r["local_total"] for r in started),
                    }
                ).to_wire()
            await asyncio.sleep(min(pause, max(left, 0)))
            pause = min(2 * pause, POLL_S[1])

    async def _native(self) -> dict:
        """Every rank's logical counts from the engine's own counters, summed; the first reason if a rank has none."""
        answers = sorted(await self._all_ok(NATIVE_ACTION), key=lambda a: a["ep_rank"])
        missing = [a["reason"] for a in answers if not a["available"]]
        if missing:
            return NativeLoadAnswer(False, len(answers), reason=missing[0]).to_wire()
        total = np.sum([np.asarray(a["counts"], dtype=np.int64) for a in answers], axis=0)
        layers, counts = tuple(answers[0]["moe_layers"]), tuple(map(tuple, total.tolist()))
        return NativeLoadAnswer(True, len(answers), moe_layers=layers, counts=counts).to_wire()

    async def _answer(self, action: str, keep_skipped: bool = False) -> dict:
        if action == "dump":
            if self._dumping:
                raise RouteError(409, "a dump is already running on this server: wait for its answer before dumping again")
            self._dumping = True
            try:
                return await self._dump(keep_skipped)
            finally:
                self._dumping = False
        if action == NATIVE_ACTION:
            return await self._native()
        if action == "status":
            answers = await self._all_ok(action)
        else:
            async with self._control:
                answers = await self._all_ok(action)
        answer = aggregate_status(answers)
        return {**answer, LIVE_KEY: self.live.to_dict() if self.live is not None else None}

    # ------------------------------------------------------------ live fitness

    async def _live_loop(self) -> None:
        """Every window: read, score, alarm, publish. Never raises: a missed window is logged and skipped."""
        window = self._settings().live_window_s
        while True:
            await asyncio.sleep(window)
            try:
                await self._live_window(window)
            except (RouteError, SceneEplbError) as exc:
                logger.warning("scene-eplb: live fitness window skipped: %s", exc)
            except Exception:  # noqa: BLE001 - the poller must outlive any one bad window
                logger.exception("scene-eplb: live fitness window failed")

    async def _live_window(self, window: float) -> None:
        answers = await self._all_ok(LIVE_ACTION, timeout=window)
        sample = live_sample(answers)
        if self.live is None:
            self.live = await self._live_view(sample.logical.shape[1])
        line = self.live.observe(sample, time.monotonic())
        if line:
            (logger.warning if self.live.alarm.drift else logger.info)("%s", line)
        metrics.publish(self.live.to_dict(), self._settings().live_per_layer_metrics)

    async def _live_view(self, num_experts: int) -> LiveFitness:
        """The live view of what this server loaded (its layout, or the linear one), from rank 0's status."""
        st = aggregate_status(await self._all_ok("status"))
        layout = None
        if st["layout_path"]:
            layout = read_layout(st["layout_path"], GeometryHint(ep_size=st["ep_size"], num_experts=num_experts))
        cfg = self._settings()
        return LiveFitness.for_server(
            layout,
            num_experts,
            st["ep_size"],
            st["dispatch"],
            tuple(st["moe_layers"]),
            cfg.drift_margin,
            cfg.drift_windows,
            provenance={k: st.get(k) for k in PROVENANCE_KEYS},
        )

    def _settings(self) -> PluginConfig:
        """The server's plugin settings (live fitness runs only on servers with the flag)."""
        if self.config is None:
            raise SceneEplbError("the scene_eplb plugin is not enabled on this server")
        return self.config

    def _handler(self, action: str):
        async def handle(request: Request) -> JSONResponse:
            if self.verifier is not None and not self.verifier.verify_token(request.headers):
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            if self.engine_client is None:
                return JSONResponse({"error": "no engine behind this server"}, status_code=503)
            if KEEP_SKIPPED in request.query_params and action != "dump":
                return JSONResponse({"error": f"{KEEP_SKIPPED} applies to the dump route only"}, status_code=400)
            keep = request.query_params.get(KEEP_SKIPPED, "false").lower()
            if keep not in ("true", "false", "1", "0"):
                return JSONResponse({"error": f"{KEEP_SKIPPED} must be true or false, got {keep!r}"}, status_code=400)
            try:
                return JSONResponse(await self._answer(action, keep in ("true", "1")))
            except RouteError as exc:
                return JSONResponse({"error": str(exc)}, status_code=exc.status)

        handle.__name__ = f"scene_eplb_{action}"
        return handle


def live_sample(answers: list[dict]) -> LiveSample:
    """One cumulative sample from every rank's live answer: counts of the ranks that count each token
    once (logical, physical where every such rank has them), the sources (every rank's counts of the
    rows it routes itself: the traffic of its EP rank's static table row), every rank's timing."""
    counting = sorted((a for a in answers if a["contributes"]), key=lambda a: a["ep_rank"])
    logical = np.sum([np.asarray(a["counts"], dtype=np.int64) for a in counting], axis=0)
    physical = None
    if all(a.get("physical") is not None for a in counting):
        physical = np.sum([np.asarray(a["physical"], dtype=np.int64) for a in counting], axis=0)
    ranked = sorted(answers, key=lambda a: a["ep_rank"])
    sources: tuple[SourceTraffic, ...] = ()
    if all(a.get("own_counts") is not None for a in ranked):
        sources = tuple(SourceTraffic(a["ep_rank"], 1, np.asarray(a["own_counts"], dtype=np.int64)) for a in ranked)
    times: tuple[RankTime, ...] = ()
    if all(a.get("moe_seconds") is not None for a in ranked):
        times = tuple(
            RankTime(
                np.asarray(a["moe_seconds"], dtype=np.float64),
                a["moe_passes"],
                a["steps"],
                a["step_seconds"],
                a["step_moe_seconds"],
            )
            for a in ranked
        )
    return LiveSample(logical, sum(a["passes"] for a in counting), physical, sources, times)
