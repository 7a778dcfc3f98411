"""Scene-specific static expert-parallel load balancing (EPLB) for vLLM and vLLM-Ascend.

The top-level modules (counts, layout, dispatch, score, fit, evaluation, formats, report, protocol,
config) are the pure core: numpy and the standard library, no torch, no inference engine. The
engine code is in ``adapters/``, engine-neutral runtime code in ``runtime/``, the A/B harness in
``harness/``, the clients of a running server in ``client/``, the CLI in ``cli`` and ``commands/``.
See docs/glossary.md for the words.
"""

__version__ = "0.1.0"
