"""The plugin's wire contract, in one place: route paths, status keys, the startup log line.

The server side (engine adapters) and the client side (``scene-eplb record``, ``audit``, ``bench``)
both import it, so a route or key renamed here is renamed everywhere. Stdlib only.
"""

from __future__ import annotations

import re
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

# What each worker reports; GET /scene_eplb/status answers EP rank 0's, plus RANKS_KEY and AGREE_KEY.
STATUS_KEYS = (
    "plugin_version",
    "engine",
    "model",
    "role",
    "ep_size",
    "ep_rank",
    "dp_rank",
    "tp_rank",
    "layout_hash",
    "layout_path",
    "redundant_slots",
    "dispatch",
    "observer",
    "recording",
    "ring_entries",
    "entries_written",
    "passes_recorded",
    "steps_per_entry",
    "skipped_passes",
    "skipped_recorded",
    "live_counts",
    "moe_layers",
    "top_k",
    "expert_groups",
)
# Every rank's view, one entry per worker, under this key of the status answer.
RANKS_KEY = "ranks"
RANK_KEYS = (
    "ep_rank",
    "dp_rank",
    "tp_rank",
    "observer",
    "layout_hash",
    "redundant_slots",
    "dispatch",
    "entries_written",
    "passes_recorded",
    "skipped_passes",
    "skipped_recorded",
)
# True when every rank agrees on these keys (what a run's audit relies on).
AGREE_KEY = "ranks_agree"
AGREEMENT_KEYS = ("layout_hash", "redundant_slots", "dispatch", "observer", "ring_entries", "ep_size")
# The dump route's query flag that writes a record with skipped passes anyway (refused without it).
KEEP_SKIPPED = "keep_skipped"
# Worker actions behind the routes (not routes of their own): the dump route polls an export with
# the first; the live-fitness poller reads every rank's cumulative counts with the second.
EXPORT_STATUS_ACTION = "export_status"
LIVE_ACTION = "live"
# The native_load route's action: each worker's logical counts from the engine's own counters.
NATIVE_ACTION = "native_load"
# The status answer's live-fitness object (see ``fitness.LiveFitness.to_dict``).
LIVE_KEY = "live"
# The status keys a dump file's metadata carries (besides what the export adds).
DUMP_META_KEYS = (
    "model",
    "role",
    "moe_layers",
    "ep_size",
    "layout_hash",
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

_LINE = (
    "scene-eplb: role={role} observer={observer} layout_hash={layout_hash} redundant_slots={redundant_slots} "
    "dispatch={dispatch} ep_size={ep_size} ({where})"
)
_LINE_RE = re.compile(
    r"scene-eplb: role=(\S+) observer=(\S+) layout_hash=(\S+)(?: \(linear\))? redundant_slots=(\d+) "
    r"dispatch=(\S+)"
)


def startup_line(status: dict, where: str) -> str:
    """The one line each worker logs at startup (what it loaded); ``where`` names the worker."""
    return _LINE.format(
        role=status["role"],
        observer=status["observer"],
        layout_hash=status["layout_hash"] or "none (linear)",
        redundant_slots=status["redundant_slots"],
        dispatch=status["dispatch"] or "none",
        ep_size=status["ep_size"],
        where=where,
    )


def parse_startup_lines(text: str) -> list[dict]:
    """Every startup line in a log, as the status keys it carries (None for "none")."""
    return [
        {
            "role": m[0],
            "observer": m[1],
            "layout_hash": None if m[2] == "none" else m[2],
            "redundant_slots": int(m[3]),
            "dispatch": None if m[4] == "none" else m[4],
        }
        for m in _LINE_RE.findall(text)
    ]


def aggregate_status(statuses: list[dict]) -> dict:
    """The status route's answer from every worker's status: EP rank 0's, every rank's view under
    ``RANKS_KEY`` (in EP rank order) and whether they agree under ``AGREE_KEY``."""
    ranked = sorted(statuses, key=lambda st: st.get("ep_rank", 0))
    first = ranked[0]
    return {
        **first,
        RANKS_KEY: [{k: st.get(k) for k in RANK_KEYS} for st in ranked],
        AGREE_KEY: all(st.get(k) == first.get(k) for st in ranked for k in AGREEMENT_KEYS),
    }


# ---------------------------------------------------------------- vLLM-Ascend's MoE comm method (helper "ascend")
# The line each vLLM-Ascend worker logs the first time a real (non-dummy) pass ran a MoE comm method
# (MC2, FUSED_MC2, ALLTOALL, ALLGATHER), and how verify.sh's mc2 check finds it in a server log.
COMM_METHOD_LINE = "scene-eplb: MoE comm method %s in a real pass"
COMM_METHOD_RE = re.compile(r"scene-eplb: MoE comm method (\w+) in a real pass")
