"""The ``vllm.general_plugins`` entry point: detect the engine once and hand over to its adapter.

Runs in every vLLM process (API server, engine core, workers). Under vLLM 0.32 the vLLM adapter
installs its patches; under vLLM-Ascend the Ascend adapter installs its startup wiring; anywhere
else (or if the Ascend adapter refuses its versions) only the engine config is patched, so that a
server started with the plugin's flag stops with the version message instead of ignoring it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from ..errors import SceneEplbError
from ..runtime.config import plugin_enabled

logger = logging.getLogger("vllm.scene_eplb")
_registered = False


def vllm_version() -> str:
    import vllm

    return vllm.__version__


def ascend_version() -> str | None:
    """The installed vllm-ascend version, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-ascend")
    except PackageNotFoundError:
        return None


def refuse_flag(check: Callable[[], None]) -> None:
    """Patch only the engine config (stable across releases) so that the plugin's flag calls
    ``check``, which raises the version message, instead of being silently ignored."""
    from vllm.config import VllmConfig

    orig = VllmConfig.__post_init__

    @functools.wraps(orig)
    def __post_init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        if plugin_enabled(self.additional_config):
            check()

    VllmConfig.__post_init__ = __post_init__


def register() -> None:
    """Install the adapter for the engine in this process (once); idle until a server sets the flag."""
    global _registered
    if _registered:
        return
    _registered = True
    from . import vllm as vllm_adapter

    version = vllm_version()
    if vllm_adapter.version_supported(version):
        vllm_adapter.register()
        return
    ascend = ascend_version()
    if ascend is not None:
        from . import vllm_ascend

        try:
            vllm_ascend.register(ascend, version)
        except SceneEplbError as exc:
            logger.warning("scene-eplb: %s: the plugin installs nothing here", exc.problem)
            refuse_flag(functools.partial(vllm_ascend.check_versions, ascend, version))
        return
    logger.warning(
        "scene-eplb: written for vLLM %s, found %s: the plugin installs nothing here "
        "(a server started with scene_eplb in --additional-config will refuse to start)",
        vllm_adapter.supported_names(),
        version,
    )
    refuse_flag(functools.partial(vllm_adapter.check_engine_version, version))
