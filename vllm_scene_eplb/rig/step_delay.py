"""Test-only: a known extra time in every engine step, to move a node's step time by a controlled
amount (the P/D pair calibration: how a P step that is d ms longer moves the whole pair). Off unless
``SCENE_EPLB_TEST_STEP_DELAY_FILE`` names a file; that file holds the delay in milliseconds and is
re-read when it changes, so one server serves both arms of an interleaved A/B. Never set in production.

No product module imports it: ``local_server`` starts a server whose environment sets the variable
with ``--worker-extension-cls`` naming ``step_delay_worker``, which vLLM imports in each worker and
which installs ``StepDelay.spend`` on the product's step hook point (``runtime/worker/step_hook``).

The delay is spent spinning on the step's thread, as compute would spend it: a sleep frees the core
for whatever shares it (on the CPU pair, the API servers and the clients), and that work then leaves
the rest of the step, so the step grows by less than the delay (seen: a 60 ms sleep a step left P's
busy seconds per prefill at 64 ms against 63 without it).

Write it with ``write_delay`` (a new file renamed over the old one): rewritten in place, a step could
read it truncated between the truncate and the write, and since a file's mtime ticks only every few
ms the write after would look like no change, leaving the old delay in force for the whole arm."""

from __future__ import annotations

import logging
import math
import os
import time

from ..errors import SceneEplbError

DELAY_ENV = "SCENE_EPLB_TEST_STEP_DELAY_FILE"
# what ``local_server`` names as vLLM's --worker-extension-cls where a server's environment sets DELAY_ENV
WORKER_EXTENSION = "vllm_scene_eplb.rig.step_delay_worker.StepDelayWorker"
MAX_DELAY_MS = 10_000.0
logger = logging.getLogger("vllm.scene_eplb")


def _read_ms(path: str) -> float:
    """The delay the file holds (a number of ms in [0, MAX_DELAY_MS]), or a SceneEplbError naming the file."""
    try:
        text = open(path).read().strip()  # noqa: SIM115 - a few bytes, closed on return
        ms = float(text)
    except (OSError, ValueError) as exc:
        raise SceneEplbError(f"{DELAY_ENV}={path}: not a number of milliseconds ({exc})") from None
    if not math.isfinite(ms) or not 0 <= ms <= MAX_DELAY_MS:
        raise SceneEplbError(f"{DELAY_ENV}={path}: {text!r} ms is outside [0, {MAX_DELAY_MS:g}]")
    return ms


def write_delay(path: str | os.PathLike, ms: float) -> None:
    """Set the delay a server reads from ``path``: a whole new file (a new inode) renamed over the old."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(repr(float(ms)))
    os.replace(tmp, path)


def _identity(path: str) -> tuple[int, int, int] | None:
    """What changes whenever the file is replaced or rewritten: inode, mtime and size (None: missing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class StepDelay:
    """The delay of ``DELAY_ENV``'s file, read at startup (a bad one refuses to start) and again each
    time the file changes (a bad value then keeps the last good one, with a warning)."""

    def __init__(self, path: str):
        self.path = path
        self.identity = _identity(path)
        self.seconds = _read_ms(path) / 1000.0

    @classmethod
    def from_env(cls) -> StepDelay | None:
        path = os.environ.get(DELAY_ENV)
        return cls(path) if path else None

    def spend(self) -> None:
        """Spin for this step's delay on the calling thread (after a cheap check whether the file changed)."""
        identity = _identity(self.path)
        if identity != self.identity:
            self.identity = identity
            try:
                self.seconds = _read_ms(self.path) / 1000.0
            except SceneEplbError as exc:
                logger.warning("scene-eplb: %s; the step delay stays %.1f ms", exc, 1000 * self.seconds)
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
