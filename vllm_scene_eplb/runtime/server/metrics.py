"""Live fitness on the server's own ``/metrics``: Prometheus gauges in the API server process.

Low cardinality: two stats (median, worst MoE layer) of live, expected, measured (replica traffic)
and time balancedness, the dispatch's fidelity error, the MoE share of step time and one drift
flag; with a speculative drafter's MoE layers, their live balancedness and share apart; per-layer series only when ``scene_eplb.live_per_layer_metrics`` asks for them (never per
expert). ``multiprocess_mode="mostrecent"`` keeps them right under vLLM's multi-process
metrics (``--api-server-count`` > 1 sets PROMETHEUS_MULTIPROC_DIR): every API server process
polls the same workers and the newest value wins. Created on first use, after vLLM has set up
its metrics, so they land in the registry its ``/metrics`` serves.
"""

from __future__ import annotations

from ...protocol import FlowView, LiveAnswer

LIVE = "scene_eplb_live_balancedness"
EXPECTED = "scene_eplb_expected_balancedness"
MEASURED = "scene_eplb_measured_balancedness"
TIME = "scene_eplb_moe_time_balancedness"
FIDELITY = "scene_eplb_dispatch_fidelity_error"
MOE_SHARE = "scene_eplb_moe_time_share"
DRIFT = "scene_eplb_drift"
LAYER = "scene_eplb_live_layer_balancedness"
DRAFTER = "scene_eplb_drafter_live_balancedness"
DRAFTER_SHARE = "scene_eplb_drafter_share"
FLOW = "scene_eplb_node_flow"
# The node's flow fields on /metrics, one label value each (FlowView's numbers: rates per second, shares, ms).
# The gauges are set every live window, so each carries the window it was taken over (window_s): rate x
# window_s is the count, whenever it is scraped.
FLOW_FIELDS = (
    "window_s",
    "prefill_completions_per_s",
    "prefilled_tokens_per_s",
    "generated_tokens_per_s",
    "finished_per_s",
    "busy_share",
    "waiting_mean",
    "running_mean",
    "batch_share",
    "kv_fetching_mean",
    "first_token_ms",
    "short_steps_share",
)
_gauges: dict = {}


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()):
    if name not in _gauges:
        from prometheus_client import Gauge

        _gauges[name] = Gauge(name, doc, list(labels), multiprocess_mode="mostrecent")
    return _gauges[name]


def publish(live: LiveAnswer, per_layer: bool) -> None:
    """Set the gauges from the status route's ``live`` object (NaN where there is no value yet)."""
    nan = float("nan")
    stats: tuple[tuple[str, str, tuple[float | None, float | None]], ...] = (  # gauge, its help, and its (median, worst)
        (LIVE, "Max/mean EP rank load of the last live window under the loaded layout and dispatch", (live.median, live.worst)),
        (
            EXPECTED,
            "Max/mean EP rank load the loaded layout was fitted to expect on its own scene",
            (live.expected_median, live.expected_worst),
        ),
        (
            MEASURED,
            "Max/mean EP rank load of the physical slot counts the ranks measured in the last window",
            (None, None) if live.measured is None else (live.measured.median, live.measured.worst),
        ),
        (
            TIME,
            "Max/mean over EP ranks of local expert time per MoE layer in the last window (time_moe)",
            (None, None) if live.time is None else (live.time.median, live.time.worst),
        ),
    )
    d = live.drafter  # a drafter's MoE layers, apart: not in the gauges above
    if d is not None:
        stats += (
            (DRAFTER, "Max/mean EP rank load of the speculative drafter's MoE layers in the last window", (d.median, d.worst)),
        )
    for name, doc, values in stats:
        gauge = _gauge(name, doc, ("stat",))
        for stat, value in zip(("median", "worst"), values):
            gauge.labels(stat=stat).set(nan if value is None else value)
    _gauge(FIDELITY, "Largest difference between a slot's measured and modelled share of its expert in the last window").set(
        nan if live.fidelity is None else live.fidelity
    )
    share = None if live.time is None else live.time.moe_share
    _gauge(MOE_SHARE, "Local expert time over step wall time in the last window (time_moe)").set(nan if share is None else share)
    _gauge(DRIFT, "1 while the live median stays above the expected median by the drift margin").set(1 if live.drift else 0)
    if d is not None:
        doc = "Share of the last window's routed assignments made in the drafter's MoE layers (the rest: the target's)"
        _gauge(DRAFTER_SHARE, doc).set(nan if d.share is None else d.share)
    if per_layer and live.per_layer is not None:
        layer = _gauge(LAYER, "Max/mean EP rank load of one MoE layer in the last live window", ("layer",))
        for idx, value in zip(live.layers, live.per_layer):
            layer.labels(layer=str(idx)).set(value)


def publish_flow(flow: FlowView) -> None:
    """Set the node's flow gauge, one series per field of ``FLOW_FIELDS`` (NaN where there is no value)."""
    gauge = _gauge(FLOW, "The node's flow over its last engine steps (P supply, D demand): field= names the quantity", ("field",))
    for name in FLOW_FIELDS:
        value = getattr(flow, name)
        gauge.labels(field=name).set(float("nan") if value is None else value)
