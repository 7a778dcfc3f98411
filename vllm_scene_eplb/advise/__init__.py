"""Will a candidate layout pay in time, not only in counts? A count -> time model, per pass, and a
verdict, one module per stage:

1. ``model``: the count -> time model fitted on the running server's timing window (``fit_time_model``);
2. ``passes``: the dump's ring entries split into the passes they held (``recorded_passes``);
3. ``setups``: the running layout and the candidate as one yardstick, their dispatch an operator
   from logical counts to rank loads (``Setup``);
4. ``prediction``: the MoE critical path per pass of both and the throughput ratio over the step's
   cycle (``Prediction``);
5. ``gates``: the input's shapes, the evidence, the provenance, the model against measurement and
   the noise floor;

with ``verdict`` running them (``advise``): trial | skip | insufficient_evidence, each reason in
words; and, once a candidate has run, ``error_split``: its own window against the prediction, the
error as three causes. ``pair``, a package of the same stages (``inputs``, ``solver``, ``model``,
``prediction``, ``gates``, ``verdict``), is ``pair-advise``'s: what a node's ratio does to a P/D
pair's throughput (``pair_advise``). Pure numpy, no engine.
"""

from .gates import MIN_PASSES, NOISE_FLOOR
from .model import TimeModel, fit_time_model
from .passes import passes_per_entry, split_passes
from .setups import Setup
from .verdict import advise

__all__ = [
    "MIN_PASSES",
    "NOISE_FLOOR",
    "Setup",
    "TimeModel",
    "advise",
    "fit_time_model",
    "passes_per_entry",
    "split_passes",
]
