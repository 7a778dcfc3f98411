"""vLLM 0.32 / 0.33 adapter.

- ``version``: the releases it was written for, and the refusal of any other;
- ``runtime``: this worker's plugin state (settings, layout, observer, control), a null object when off;
- ``patches``: the vLLM functions it wraps (model build, router, CPU experts, step boundary);
- ``routes``: the ``vllm.endpoint_plugins`` entry point (``runtime.server.http_routes`` on vLLM 0.32's API server);
- ``cpu_moe``: CPU experts that compute only the assignments routed to local slots.
"""

from __future__ import annotations

from .version import SUPPORTED_VLLM, check_engine_version, engine_version, supported_names, version_supported

__all__ = ["SUPPORTED_VLLM", "check_engine_version", "engine_version", "register", "supported_names", "version_supported"]

_installed = False


def register() -> None:
    """Install the patches once per process (called by ``adapters.entry.register``)."""
    global _installed
    if not _installed:
        from .patches import install

        install()
        _installed = True
