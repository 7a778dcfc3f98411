"""The stand-ins' way into a vLLM worker process: a test names ``StandInsWorker`` as vLLM's
``--worker-extension-cls`` (with ``tests/v4_standin`` on the server's ``PYTHONPATH``), and vLLM imports
this module in every worker after its platform registered its own Triton fallbacks and before it
builds the worker and the model; importing it installs what this host lacks and logs the names."""

from __future__ import annotations

import sys

from v4_stand_ins import install

INSTALLED_LINE = "scene-eplb test stand-ins:"  # the log line a test reads: what this worker installed


class StandInsWorker:
    """Nothing of its own: vLLM adds it to the worker's bases, so importing this module is the point."""


print(f"{INSTALLED_LINE} {','.join(install()) or 'none'}", file=sys.stderr, flush=True)
