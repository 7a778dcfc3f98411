"""The ``vllm.endpoint_plugins`` entry point of vLLM 0.32: the recorder routes and live fitness
(``runtime.server.http_routes``, ``runtime.server.live_poller``), reaching every worker of every DP engine through each engine core."""

from __future__ import annotations

from typing import Any

from ...runtime.server.fanout import CONTROL
from ...runtime.server.http_routes import SceneEplbEndpoints
from .version import check_engine_version


class VllmEndpoints(SceneEplbEndpoints):
    """The routes on vLLM 0.32's API server."""

    def check_version(self) -> None:
        check_engine_version()

    def attach_flow(self, engine_client, window_s: float):
        from .flow_logger import attach_flow

        return attach_flow(engine_client, window_s)

    def api_key_verifier(self, tokens: list[str]):
        from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

        return AuthenticationMiddleware(None, tokens)

    async def call_every_worker(self, args: tuple) -> list:
        core: Any = getattr(self.engine_client, "engine_core", None)
        if hasattr(core, "call_utility_all_async"):  # every DP engine, each running collective_rpc on its workers
            return [
                r for engine in await core.call_utility_all_async("collective_rpc", CONTROL, None, args, None) for r in engine
            ]
        return list(await self.engine_client.collective_rpc(CONTROL, args=args))


def endpoint_plugin() -> VllmEndpoints:
    """``vllm.endpoint_plugins`` entry point factory."""
    return VllmEndpoints()
