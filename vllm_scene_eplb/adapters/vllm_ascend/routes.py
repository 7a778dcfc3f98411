"""The recorder routes and live fitness (``runtime.server.http_routes``, ``runtime.server.live_poller``) on vLLM 0.23's API server.

vLLM 0.23 has no endpoint plugins: ``attach_to_api_server`` wraps the server module's ``build_app``
(the routes join the app) and ``init_app_state`` (they get the engine client). Every worker of
every DP engine is reached with one ``collective_rpc`` utility call per engine core (vLLM 0.23's DP
client answers only the first engine's result to its own all-engine utility calls).
"""

from __future__ import annotations

import asyncio
import functools

from ...runtime.server.fanout import CONTROL
from ...runtime.server.http_routes import SceneEplbEndpoints
from .version import check_versions

WRAPPED = "__scene_eplb_original__"


class AscendEndpoints(SceneEplbEndpoints):
    """The routes on vLLM 0.23's API server in front of vLLM-Ascend engines."""

    def __init__(self, versions: tuple[str, str]):
        super().__init__()
        self.versions = versions  # (vllm-ascend, vllm) as installed

    def check_version(self) -> None:
        check_versions(*self.versions)

    def api_key_verifier(self, tokens: list[str]):
        from vllm.entrypoints.serve.utils.server_utils import AuthenticationMiddleware

        return AuthenticationMiddleware(None, tokens)

    async def call_every_worker(self, args: tuple) -> list:
        core = self.engine_client.engine_core
        engines = getattr(core, "core_engines", None)
        if not engines:
            return list(await self.engine_client.collective_rpc(CONTROL, args=args))
        answers = await asyncio.gather(
            *(core._call_utility_async("collective_rpc", CONTROL, None, args, None, engine=e) for e in engines)
        )
        return [r for engine in answers for r in engine]


def attach_to_api_server(module, versions: tuple[str, str]) -> None:
    """Wrap ``module.build_app`` and ``module.init_app_state`` (once) so every app it builds serves the routes."""
    if hasattr(module.build_app, WRAPPED):
        return
    endpoints = AscendEndpoints(versions)
    build, init = module.build_app, module.init_app_state

    @functools.wraps(build)
    def build_app(*args, **kwargs):
        app = build(*args, **kwargs)
        endpoints.attach_router(app)
        return app

    @functools.wraps(init)
    async def init_app_state(engine_client, state, args, *rest, **kwargs):
        await init(engine_client, state, args, *rest, **kwargs)
        await endpoints.init_state(engine_client, state, args)

    setattr(build_app, WRAPPED, build)
    module.build_app, module.init_app_state = build_app, init_app_state
