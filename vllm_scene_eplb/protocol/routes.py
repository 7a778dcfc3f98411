"""The control routes, the worker actions behind them and the keys their answers carry."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    """One control route: the worker action it triggers, its HTTP method and path."""

    action: str
    method: str
    path: str


# SGLang's route names for the recorder, plus our status and native-load routes.
ROUTES = (
    Route("start", "POST", "/start_expert_distribution_record"),
    Route("stop", "POST", "/stop_expert_distribution_record"),
    Route("dump", "POST", "/dump_expert_distribution_record"),
    Route("status", "GET", "/scene_eplb/status"),
    # The engine's own expert-load counters over the last record, in logical ids (vLLM-Ascend with dynamic EPLB).
    Route("native_load", "GET", "/scene_eplb/native_load"),
)
ROUTE_BY_ACTION = {r.action: r for r in ROUTES}
ACTIONS = tuple(ROUTE_BY_ACTION)

# Every rank's view, one entry per worker, under this key of the status answer (``RANK_KEYS``).
RANKS_KEY = "ranks"
# True when every rank agrees on these keys (what a run's audit relies on).
AGREE_KEY = "ranks_agree"
AGREEMENT_KEYS = ("layout_hash", "redundant_slots", "dispatch", "observer", "ring_entries", "ep_size")
# The dump route's query flag that writes a record with skipped passes anyway (refused without it).
KEEP_SKIPPED = "keep_skipped"
# Worker actions behind the routes (not routes of their own): the dump route polls an export with
# the first; the live-fitness poller reads every rank's cumulative counts with the second, and with
# the third the counts each rank had as the last record started and stopped (the record's own window).
EXPORT_STATUS_ACTION = "export_status"
LIVE_ACTION = "live"
RECORD_LIVE_ACTION = "record_live"
# The native_load route's action: each worker's logical counts from the engine's own counters.
NATIVE_ACTION = "native_load"
# The status answer's live-fitness object (built by ``fitness.LiveFitness.answer``).
LIVE_KEY = "live"
# The status keys a dump file's metadata carries (besides what the export adds).
DUMP_META_KEYS = (
    "model",
    "role",
    "moe_layers",
    "drafter_layers",
    "ep_size",
    "layout_hash",
    "redundant_slots",
    "dispatch",
    "passes_recorded",
    "engine",
    "plugin_version",
    "top_k",
    "expert_groups",
)
# The status keys an audit compares between the status route and every worker's startup line.
AUDITED_KEYS = ("layout_hash", "redundant_slots", "dispatch")

# Observer states, as status and the startup line report them.
OBSERVER_OFF, OBSERVER_IDLE, OBSERVER_RECORDING = "off", "idle", "recording"
# How a worker's ``load_audit`` starts: its audit passed ("passed:18-slots,..."), or a test served a
# load its audit refused (the vLLM adapter's test-only planted mis-load).
LOAD_AUDIT_PASSED, LOAD_AUDIT_REFUSED = "passed:", "refused"
