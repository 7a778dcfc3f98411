"""The plugin's wire contract, in one place: route paths, status keys, the startup log line.

The server side (engine adapters) and the client side (``scene-eplb record``, ``audit``, ``bench``)
both import it, so a route or key renamed here is renamed everywhere. Stdlib only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .errors import SceneEplbError


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


# ---------------------------------------------------------------- timing window (helper "advise")
#
# The status answer's ``live.time`` object as ``advise`` reads it, checked where it is read: a
# timing window with NaN, a negative time or a step shorter than the MoE time in it is refused
# with the field named, never priced. Stdlib only, like the rest of this module.

# What a timing window says about the server it came from; a dump's metadata carries the same keys,
# and ``advise`` refuses to price a dump with the timing of another layout, geometry or role.
PROVENANCE_KEYS = ("layout_hash", "ep_size", "redundant_slots", "role", "dispatch", "steps_per_entry", "engine", "plugin_version")


def _finite(value, field: str, where: str) -> float:
    """A finite non-negative number (not a bool, not a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise SceneEplbError(f"timing {field} must be a finite non-negative number, got {value!r}", where)
    return float(value)


def _matrix(value, field: str, where: str) -> tuple[tuple[float, ...], ...]:
    """A non-empty [ranks][layers] list of lists of finite non-negative numbers, every row as long."""
    if not isinstance(value, list) or not value or not all(isinstance(row, list) and row for row in value):
        raise SceneEplbError(f"timing {field} must be a non-empty [ranks][layers] list of lists", where)
    if len({len(row) for row in value}) != 1:
        raise SceneEplbError(f"timing {field} is ragged: rows of {sorted({len(r) for r in value})} layers", where)
    return tuple(tuple(_finite(x, f"{field}[{r}][{i}]", where) for i, x in enumerate(row)) for r, row in enumerate(value))


@dataclass(frozen=True)
class TimingWindow:
    """One live window's MoE timing over every rank: ``rank_ms`` [ranks][layers] local expert ms
    per pass and ``rank_assignments`` [ranks][layers] the assignments each rank computed per pass
    (the x of advise's count -> time model), ``step_ms`` the mean wall ms of a step, ``moe_share``
    its MoE part, ``sub_windows`` the step ms of the server's recent windows (their spread is a
    measured noise floor), ``provenance`` the server it came from (``PROVENANCE_KEYS``, None where
    not said)."""

    rank_ms: tuple[tuple[float, ...], ...]
    rank_assignments: tuple[tuple[float, ...], ...]
    step_ms: float
    moe_share: float | None = None
    sub_windows: tuple[float, ...] = ()
    provenance: dict = field(default_factory=dict)

    @property
    def ranks(self) -> int:
        return len(self.rank_ms)

    @property
    def layers(self) -> int:
        return len(self.rank_ms[0])

    @classmethod
    def from_wire(cls, doc, where: str = "timing", layers: int | None = None, provenance: dict | None = None) -> TimingWindow:
        """The window from a ``live.time`` object, checked: finite non-negative ms, a positive
        ``step_ms`` at least the MoE ms a rank spends in it, ``moe_share`` in [0, 1], ``rank_ms`` and
        ``rank_assignments`` of one shape (with ``layers`` MoE layers when given). ``provenance``:
        the status answer's keys around it, where the window itself does not carry them."""
        if not isinstance(doc, dict):
            raise SceneEplbError(f"timing must be a JSON object, got {type(doc).__name__}", where)
        for key in ("rank_ms", "rank_assignments", "step_ms"):
            if doc.get(key) is None:
                raise SceneEplbError(f"timing has no {key}: the window saw no timed traffic", where)
        rank_ms = _matrix(doc["rank_ms"], "rank_ms", where)
        assignments = _matrix(doc["rank_assignments"], "rank_assignments", where)
        shape = (len(rank_ms), len(rank_ms[0]))
        if (len(assignments), len(assignments[0])) != shape:
            raise SceneEplbError(
                f"timing rank_assignments is [{len(assignments)}][{len(assignments[0])}], rank_ms [{shape[0]}][{shape[1]}]: "
                "one value per rank and MoE layer in both",
                where,
            )
        if layers is not None and shape[1] != layers:
            raise SceneEplbError(f"timing has {shape[1]} MoE layers, the candidate {layers}", where)
        step_ms = _finite(doc["step_ms"], "step_ms", where)
        rank_moe = max(sum(row) for row in rank_ms)
        if step_ms <= 0 or step_ms < rank_moe * (1 - 1e-9):
            raise SceneEplbError(
                f"timing step_ms {step_ms:g} is not positive or shorter than the {rank_moe:g} ms of MoE a rank spends in it",
                where,
            )
        share = doc.get("moe_share")
        if share is not None and _finite(share, "moe_share", where) > 1:
            raise SceneEplbError(f"timing moe_share must be in [0, 1], got {share!r}", where)
        subs = doc.get("sub_windows") or []
        if not isinstance(subs, list):
            raise SceneEplbError("timing sub_windows must be a list of step ms", where)
        sub_windows = tuple(_finite(x, f"sub_windows[{i}]", where) for i, x in enumerate(subs))
        said = doc.get("provenance") or {}
        if not isinstance(said, dict):
            raise SceneEplbError("timing provenance must be an object", where)
        known = {**(provenance or {}), **said}
        return cls(
            rank_ms,
            assignments,
            step_ms,
            None if share is None else float(share),
            sub_windows,
            {k: known.get(k) for k in PROVENANCE_KEYS},
        )

    @classmethod
    def from_status(cls, doc, where: str = "timing", layers: int | None = None) -> TimingWindow | None:
        """The window of a status answer, its ``live`` object or the ``live.time`` object itself, its
        provenance from the status keys around it; None where the server has no timed window yet."""
        if not isinstance(doc, dict):
            raise SceneEplbError("timing must be a JSON object (a status answer, its live object or live.time)", where)
        around = {k: doc[k] for k in PROVENANCE_KEYS if k in doc}
        live = doc.get(LIVE_KEY, doc)
        if live is None:
            return None  # a status answer without a live window yet
        if not isinstance(live, dict):
            raise SceneEplbError("timing's live must be an object", where)
        timing = live.get("time", live)
        return None if timing is None else cls.from_wire(timing, where, layers, around)

    def to_wire(self) -> dict:
        return {
            "rank_ms": [list(r) for r in self.rank_ms],
            "rank_assignments": [list(r) for r in self.rank_assignments],
            "step_ms": self.step_ms,
            "moe_share": self.moe_share,
            "sub_windows": list(self.sub_windows),
            "provenance": dict(self.provenance),
        }
