"""The ``vllm.endpoint_plugins`` entry point: recorder control routes at SGLang's names, plus status
(the paths are in ``protocol.ROUTES``).

Each route calls ``scene_eplb_control`` on every worker (collective_rpc) and answers rank 0's
result. Misuse answers 409 with ``{"error": ...}`` and the server keeps serving. The dump path is
chosen by the workers inside the configured ``dump_dir``; a request cannot name one. The routes
honour ``--api-key`` / ``VLLM_API_KEY`` (vLLM's own middleware guards only /v1-style paths).
"""

from __future__ import annotations

import os
from argparse import Namespace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ...config import plugin_enabled
from ...protocol import ROUTES
from .version import check_engine_version

RPC_TIMEOUT_S = 300.0


class SceneEplbEndpoints:
    """Endpoint plugin object (vLLM's EndpointPlugin protocol)."""

    name = "scene_eplb"
    required_tasks = None

    def __init__(self) -> None:
        self.engine_client = None
        self.verifier = None

    def attach_router(self, app: FastAPI) -> None:
        for route in ROUTES:
            app.add_api_route(route.path, self._handler(route.action), methods=["GET", "POST"], name=f"scene_eplb_{route.action}")

    async def init_state(self, engine_client, state, args: Namespace) -> None:
        import json

        raw = getattr(args, "additional_config", None)
        if isinstance(raw, str):
            raw = json.loads(raw) if raw else None
        if plugin_enabled(raw):
            check_engine_version()  # refuse to serve with an adapter written for another vLLM
        self.engine_client = engine_client
        tokens = [k for k in (getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]) if k]
        if tokens:
            from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

            self.verifier = AuthenticationMiddleware(None, tokens)

    def _handler(self, action: str):
        async def handle(request: Request) -> JSONResponse:
            if self.verifier is not None and not self.verifier.verify_token(request.headers):
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            if self.engine_client is None:
                return JSONResponse({"error": "no engine behind this server"}, status_code=503)
            try:
                results = await self.engine_client.collective_rpc("scene_eplb_control", timeout=RPC_TIMEOUT_S, args=(action,))
            except Exception as exc:  # noqa: BLE001 - the engine answered with an error; keep serving
                return JSONResponse({"error": f"{action} failed in the engine: {exc}"}, status_code=500)
            result = results[0] if isinstance(results, list) and results else results
            if not isinstance(result, dict):
                return JSONResponse({"error": f"unexpected worker answer {result!r}"}, status_code=500)
            if not result.get("ok"):
                return JSONResponse({"error": result.get("error")}, status_code=result.get("http_status", 409))
            return JSONResponse({k: v for k, v in result.items() if k != "ok"})

        handle.__name__ = f"scene_eplb_{action}"
        return handle


def endpoint_plugin() -> SceneEplbEndpoints:
    """``vllm.endpoint_plugins`` entry point factory."""
    return SceneEplbEndpoints()
