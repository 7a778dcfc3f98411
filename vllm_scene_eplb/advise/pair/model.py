"""The pair's model from its windows: the network the two nodes' windows and the bench give, fitted
to the measured throughput (``fitted``), and D's time per token under a candidate's cycle ratio.
Pure numpy."""

from __future__ import annotations

from ...errors import SceneEplbError
from .inputs import NodeWindow, PairLoad
from .solver import Network, calibrate


def network(p: NodeWindow, d: NodeWindow, load: PairLoad, elasticity: float = 0.0) -> Network:
    """The network the two windows and the bench give (no client time yet: ``calibrate``)."""
    fp, fd = p.flow, d.flow
    if fp.busy_share is None:
        raise SceneEplbError(
            "the P node's flow has no busy_share: start it with scene_eplb.time_moe true, and take its status "
            "once a live window that holds the bench's steps has ended"
        )
    if fp.prefill_completions_per_s <= 0 or fp.busy_share <= 0:
        raise SceneEplbError("the P node's window prefilled nothing: take its status while the bench runs")
    if fd.running_mean <= 0 or fd.first_token_ms is None:
        raise SceneEplbError("the D node's window decoded nothing: take its status while the bench runs")
    occupancy = fp.busy_share
    if p.step_ms:  # the pause between busy steps is P's too: a busy P pays step and pause
        occupancy = min(1.0, fp.busy_share * (p.step_ms + (p.gap_ms or 0.0)) / p.step_ms)
    admission = max(0.0, fd.waiting_mean - fd.kv_fetching_mean) * d.engines / max(fd.finished_per_s, 1e-12)
    return Network(
        s_p=occupancy * p.engines / fp.prefill_completions_per_s,
        p_engines=p.engines,
        handoff_s=max(0.0, fd.first_token_ms / 1000.0 - admission),
        client_s=0.0,
        tau=load.tau(),
        decode_tokens=float((load.output_lens - 1).clip(0).mean()),
        d_engines=d.engines,
        d_max=fd.max_num_seqs,
        b_ref=fd.running_mean,
        elasticity=elasticity,
    )


def d_token_ratio(ratio: float, d: NodeWindow, tau: float) -> float:
    """D's time per output token, now over with the candidate, from its cycle ratio ``ratio``: the
    cycle's saved time comes off each token (a TPOT longer than D's cycle keeps the rest); without
    a timed cycle, or one longer than the TPOT, the TPOT itself scales."""
    cycle = d.cycle_s
    if cycle is None or cycle > tau:
        return ratio
    return tau / max(1e-12, tau - cycle * (1 - 1 / ratio))


def fitted(p: NodeWindow, d: NodeWindow, load: PairLoad, elasticity: float) -> tuple[Network, float]:
    """The network of ``network`` with the clients' time fitted to a closed load's throughput, and
    ``calibrate``'s fit (1.0 for an open load, which has no clients' time)."""
    net = network(p, d, load, elasticity)
    return calibrate(net, load.clients, load.throughput) if load.closed else (net, 1.0)
