"""Test servers' message-queue readers hand the core over while they wait. Every Python process with
``tests/server_site`` first on its ``PYTHONPATH`` (a test server's API server, engine core and workers:
``rig.local_server`` puts it there where ``SERVER_SITE_ENV`` names it, as the test session does) makes
vLLM's shared-memory message-queue readers sleep ``BUSY_POLL_S`` between their checks for a new message
in the second after a read (``SpinCondition.busy_loop_s``), where vLLM 0.32 calls ``sched_yield``. On a
2-core host that yield loop starved every other process about a hundredfold (the test process's own
work and each CLI it starts: an audit took 46 s instead of 0.3 s), and a live window under a second
long kept it spinning for good. The readers still check for a message every ``BUSY_POLL_S`` and go idle
after the same second: only the yield goes. (Idle at once instead, waiting on the queue's notification
from the first miss, a decode server generated under 2 tokens/s: a missed notification waits out vLLM's
5 s recheck.) A ``sitecustomize`` further down the path (``tests/v4_standin``'s) runs next, as it would alone.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

QUEUE_MODULE = "vllm.distributed.device_communicators.shm_broadcast"


BUSY_POLL_S = 0.0005  # seconds between a reader's checks in its busy second (a step here takes milliseconds)


def sleep_between_checks(spin_condition: type) -> None:
    """Readers of ``spin_condition`` (vLLM's ``SpinCondition``) sleep ``BUSY_POLL_S`` where they would
    yield, in the busy second after a read; after it they wait for the notification as vLLM does."""
    wait = spin_condition.wait

    def busy_sleeping_wait(self, timeout_ms=None):
        if self.is_reader and time.monotonic() <= self.last_read + self.busy_loop_s:
            time.sleep(BUSY_POLL_S)
            return
        wait(self, timeout_ms)

    spin_condition.wait = busy_sleeping_wait


class QueueFinder(importlib.abc.MetaPathFinder):
    """Finds vLLM's message-queue module through the other finders and patches it once it has run."""

    def find_spec(self, name, path, target=None):
        if name != QUEUE_MODULE:
            return None
        others = [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]
        spec = next((s for f in others if (s := f.find_spec(name, path, target)) is not None), None)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def run_and_patch(module):
            exec_module(module)
            sleep_between_checks(module.SpinCondition)

        spec.loader.exec_module = run_and_patch
        return spec


sys.meta_path.insert(0, QueueFinder())


def run_next_sitecustomize() -> None:
    """The first other ``sitecustomize.py`` on the path, run as Python would have run it without this one."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.abspath(entry or ".") != here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_next_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


run_next_sitecustomize()
