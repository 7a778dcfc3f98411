"""The recorder's HTTP routes at SGLang's names, plus status (the paths are in ``protocol.ROUTES``),
for any engine: an adapter subclasses ``SceneEplbEndpoints`` with how its API server reaches every
worker, checks its version and verifies API keys, and attaches it to its server.

Each route runs its action on every worker of every DP engine (``fanout``) and answers for all of
them: ``status`` is EP rank 0's status plus every rank's view and whether they agree
(``protocol.StatusAnswer``), with the live-fitness poller's ``live`` object (``live_poller``). A
route that fails answers its HTTP status and one line (``fanout.RouteError``); the server keeps
serving. The routes honour ``--api-key`` / ``VLLM_API_KEY`` (vLLM's own middleware guards only
/v1-style paths).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from argparse import Namespace
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ...protocol import KEEP_SKIPPED, NATIVE_ACTION, ROUTES, FlowView, StatusAnswer
from ..config import PluginConfig, parse_config
from . import metrics
from .fanout import RouteError, WorkerFanout
from .live_poller import LivePoller
from .node_flow import NodeFlow

logger = logging.getLogger("vllm.scene_eplb")


class SceneEplbEndpoints:
    """The routes and the live-fitness poller of one API server process. An engine adapter subclass
    supplies ``check_version``, ``call_every_worker`` and ``api_key_verifier``."""

    name = "scene_eplb"
    required_tasks = None

    def __init__(self) -> None:
        self.engine_client: Any = None  # the engine's client (vLLM's AsyncLLM), set by init_state
        self.verifier: Any = None
        self.config: PluginConfig | None = None
        self.fanout = WorkerFanout(self.call_every_worker)
        self.poller: LivePoller | None = None
        self.flow: NodeFlow | None = None  # the node's flow (P supply, D demand), where the engine's stats reach it
        self._flow_task: asyncio.Task | None = None

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
            self.poller = LivePoller(self.fanout, self.config)
            self.poller.start()
        if self.config is not None:
            self.flow, why_not = self.attach_flow(engine_client, self.config.flow_window_s)
            if why_not:
                logger.warning("scene-eplb: %s", why_not)
            else:
                if self.poller is not None:
                    self.poller.flow = self.flow  # each live window's step clock: the flow's busy share
                self._flow_task = asyncio.get_running_loop().create_task(self._publish_flow(), name="scene-eplb-flow")
        tokens = [k for k in (getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]) if k]
        if tokens:
            self.verifier = self.api_key_verifier(tokens)

    # ------------------------------------------------------------ what an engine adapter supplies

    def check_version(self) -> None:
        """Raise SceneEplbError when the engine is not the release the adapter was written for."""
        raise NotImplementedError

    def attach_flow(self, engine_client, window_s: float) -> tuple[NodeFlow | None, str | None]:
        """A ``NodeFlow`` the engine feeds with every step's stats, or None and why not."""
        return None, "this engine's adapter does not read its step stats: the node's flow is not measured"

    def api_key_verifier(self, tokens: list[str]):
        """The engine's API-key check: an object whose ``verify_token(headers)`` says yes or no."""
        raise NotImplementedError

    async def call_every_worker(self, args: tuple) -> list:
        """``scene_eplb_control(*args)`` on every worker of every engine behind this server: the
        answers, flat. Never passes a timeout to the engine (see ``WorkerFanout.workers``)."""
        raise NotImplementedError

    # ------------------------------------------------------------ the routes

    async def _answer(self, action: str, keep_skipped: bool = False) -> dict:
        """The route's JSON answer."""
        if action == "dump":
            export_s = self.config.export_timeout_s if self.config else PluginConfig.export_timeout_s
            return (await self.fanout.dump(keep_skipped, export_s)).to_wire()
        if action == NATIVE_ACTION:
            return (await self.fanout.native()).to_wire()
        if self.poller is None:
            return self._with_flow(await self.fanout.status(action, None)).to_wire()
        answer = await self.fanout.status(action, self.poller.answer)
        if action in ("start", "stop"):  # the record's own window, as it stopped: the answer says it
            await self.poller.record(action)
            answer = replace(answer, live=self.poller.answer)
        return self._with_flow(answer).to_wire()

    def _flow_view(self) -> FlowView | None:
        """The node's flow now (None: not measured)."""
        if self.flow is None or self.flow.broken:
            return None
        return self.flow.view()

    def _with_flow(self, answer: StatusAnswer) -> StatusAnswer:
        return replace(answer, flow=self._flow_view())

    async def _publish_flow(self) -> None:
        """The flow's gauges on /metrics every ``live_window_s``; never raises (a bad one is logged)."""
        assert self.config is not None
        while True:
            await asyncio.sleep(self.config.live_window_s)
            try:
                view = self._flow_view()
                if view is not None:
                    metrics.publish_flow(view)
            except Exception:  # noqa: BLE001 - the gauges must not end the server's loop
                logger.exception("scene-eplb: the node's flow gauges were not set")

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
