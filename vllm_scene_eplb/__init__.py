"""Scene-specific static expert-parallel load balancing (EPLB) for vLLM and vLLM-Ascend.

The top-level modules (counts, layout, dispatch, score, fit, formats, report) are pure numpy and
import no inference engine; engine code lives in ``adapters/``.
"""

__version__ = "0.1.0"
