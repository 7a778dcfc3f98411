"""The P/D pair: what a layout on the prefill node (P), the decode node (D) or both does to the whole
pair's output throughput under a measured load (``pair_advise``). Pure numpy.

One module per stage, as ``advise``'s own:

1. ``inputs``: each node's window from its status answer (``NodeWindow``), the bench's load
   (``PairLoad``) and a candidate's effect on one node (``NodeEffect``);
2. ``solver``: the closed network below (``Network``), solved exactly (``throughput``, ``solve``,
   ``calibrate``, ``open_throughput``);
3. ``model``: the network the windows and the bench give, fitted to the measured throughput
   (``network``, ``fitted``), and D's time per token under a candidate (``d_token_ratio``);
4. ``prediction``: a layout's throughput ratio and the throughput's elasticity in each node's speed;
5. ``gates``: the interval's options and whether the windows and the bench are of one load;

with ``verdict`` running them (``pair_advise``): trial | skip | insufficient_evidence per layout,
the binding side and each reason in words.

Each request of a closed loop of C clients visits four stations once per cycle:

- P, ``p_engines`` parallel servers (its DP engines), each busy ``s_p`` seconds per request (the
  utilization law on P's window: its busy share, with the pause between busy steps, over its prefill
  completions per engine). Prefill is compute-bound, so batching prompts does not raise an engine's
  rate: mu_P(n) = min(n, p_engines) / s_p requests per second with n requests at P;
- the handoff, a delay of ``handoff_s``: D's arrival-to-first-token (the KV pull and admission) less
  the admission wait D's own queue explains (that wait is D's station's, below);
- D, a batching station: with n requests decoding on ``d_engines`` engines of ``d_max`` sequences,
  b = min(n, d_engines x d_max) / d_engines per engine, every step takes tau(b) seconds and gives
  each of them a token, so mu_D(n) = d_engines x b / (decode_tokens x tau(b)); tau(b) = tau x (1 +
  elasticity x (b / b_ref - 1)): flat in the batch at elasticity 0 (memory-bound decode), throughput
  flat in the batch at 1 (compute-bound), ``tau`` the bench's time per output token at D's measured
  batch ``b_ref``;
- the clients, a delay of ``client_s``: fitted so that the model reproduces the measured throughput.

The network is product form (BCMP: P as load-dependent exponential FCFS, D as load-dependent
processor sharing, the delays infinite servers), solved exactly by the normalizing constant
(Buzen's convolution, in logs: the numbers exact MVA gives, without its loss of precision with two
load-dependent stations): X(C) = G(C-1) / G(C). A layout divides ``s_p`` or ``tau`` by its node
ratio; the pair's predicted ratio is X'(C) / X(C) under one model with the same ``client_s``.

An open load at rate lambda is served at min(lambda, P's capacity, D's capacity, the concurrency
cap's closed-loop throughput): below every capacity the ratio is 1 (the layout changes latency only).
"""

from .gates import MAX_DRAWS, MIN_DRAWS
from .inputs import NodeEffect, NodeWindow, PairLoad
from .model import d_token_ratio, network
from .solver import Network, Solution, calibrate, load_throughput, open_throughput, solve, throughput
from .verdict import DEFAULT_DRAWS, DEFAULT_ELASTICITY, pair_advise

__all__ = [
    "DEFAULT_DRAWS",
    "DEFAULT_ELASTICITY",
    "MAX_DRAWS",
    "MIN_DRAWS",
    "Network",
    "NodeEffect",
    "NodeWindow",
    "PairLoad",
    "Solution",
    "calibrate",
    "d_token_ratio",
    "load_throughput",
    "network",
    "open_throughput",
    "pair_advise",
    "solve",
    "throughput",
]
