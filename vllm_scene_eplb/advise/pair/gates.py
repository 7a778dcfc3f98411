"""The pair's gates: the interval's options (``check_draws``) and whether the windows and the bench
describe one load (``evidence_gate``), each refusal in words. Pure numpy."""

from __future__ import annotations

import math

from ...errors import SceneEplbError
from .inputs import NodeWindow, PairLoad
from .solver import Network, open_throughput

CALIBRATION_TOLERANCE = 0.10  # the model at no client time may fall this short of the measured throughput
WINDOW_AGREEMENT = 0.30  # a node's window rate may differ this much from the bench's before it is refused
SATURATED = 0.95  # an open load served below this share of its rate fell behind it
INTERVAL_TAIL = 2.5  # percent of the draws beyond each end of the interval (a 95% interval)
MIN_DRAWS = math.ceil(100 / INTERVAL_TAIL)  # 40: the fewest that put a draw, on average, beyond each end
MAX_DRAWS = 100_000  # each draw refits the network (about 3 ms at 32 clients): minutes at most


def check_draws(elasticity: float, draws: int, seed: int) -> None:
    """The interval's options, refused in one line: an elasticity in [0, 1] (flat to proportional),
    enough draws for the interval's ends (``MIN_DRAWS``), a seed numpy takes."""
    if not 0 <= elasticity <= 1:
        raise SceneEplbError(f"the decode elasticity must be in [0, 1] (0: flat, 1: proportional), got {elasticity!r}")
    if isinstance(draws, bool) or not isinstance(draws, int) or not MIN_DRAWS <= draws <= MAX_DRAWS:
        raise SceneEplbError(
            f"draws must be an integer in [{MIN_DRAWS}, {MAX_DRAWS}] (a {100 - 2 * INTERVAL_TAIL:g}% interval's ends "
            f"need {MIN_DRAWS}), got {draws!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SceneEplbError(f"the draws' seed must be an integer >= 0, got {seed!r}")


def evidence_gate(p: NodeWindow, d: NodeWindow, load: PairLoad, net: Network, fit: float) -> list[str]:
    """Why the windows and the bench do not describe one load (empty: they do)."""
    why = []
    for side, rate, what in (
        ("P", p.flow.prefill_completions_per_s, "prefill completions"),
        ("D", d.flow.finished_per_s, "finished requests"),
    ):
        if abs(rate / load.throughput - 1) > WINDOW_AGREEMENT:
            why.append(
                f"the {side} node's window saw {rate:.3g} {what}/s, the bench {load.throughput:.3g} requests/s: "
                "take both statuses while the bench runs, in its steady state"
            )
    if load.closed and fit < 1 - CALIBRATION_TOLERANCE:
        why.append(
            f"the windows explain {fit:.0%} of the measured throughput with no client time: P's busy share, "
            "D's handoff or the bench's TPOT are not of one load"
        )
    if not load.closed and load.throughput < SATURATED * load.rate:
        _, side = open_throughput(net, load.rate, load.concurrency)
        if side == "offered_load":
            why.append(
                f"the bench served {load.throughput:.3g} of {load.rate:.3g} requests/s offered, yet the model "
                "has capacity above the rate: the windows miss what held it back"
            )
    return why
