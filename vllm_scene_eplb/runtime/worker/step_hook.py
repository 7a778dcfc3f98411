"""A hook point inside every engine step, where a real step (a plugin on, tokens scheduled) begins,
inside the step's clock. A no-op unless something installs a hook: no product module does; the rig's
test-only step delay (``rig/step_delay_worker``, which vLLM imports in the worker process as its
``--worker-extension-cls``) does, for the P/D pair calibration."""

from __future__ import annotations

from collections.abc import Callable

_hook: Callable[[], None] | None = None


def install(hook: Callable[[], None] | None) -> None:
    """Run ``hook`` in every real step from now on, in this process (None: none again)."""
    global _hook
    _hook = hook


def run() -> None:
    """The installed hook, if any (called by the adapters at a real step's start)."""
    if _hook is not None:
        _hook()
