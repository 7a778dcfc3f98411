"""The test-only step delay's way into a vLLM worker process: ``local_server`` names ``StepDelayWorker``
as vLLM's ``--worker-extension-cls`` when a server's environment sets ``DELAY_ENV``, and vLLM imports
this module in every worker before it builds the worker; importing it installs the delay on the
product's step hook point (``runtime/worker/step_hook``), so no product module imports the delay.
A bad delay file refuses the worker's start, as before."""

from __future__ import annotations

from ..runtime.worker import step_hook
from .step_delay import StepDelay


class StepDelayWorker:
    """Nothing of its own: vLLM adds it to the worker's bases, so importing this module is the point."""


_delay = StepDelay.from_env()
if _delay is not None:
    step_hook.install(_delay.spend)
