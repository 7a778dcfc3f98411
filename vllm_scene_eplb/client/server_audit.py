"""`scene-eplb audit`: check that a running server loaded what was intended, from what it reports
it loaded (layout hash, redundant slots, dispatch, recorder state), so a measurement run can be audited.

Reads the plugin's status route and, optionally, the server log's startup lines (one per worker;
where the plugin has no routes, as on vLLM-Ascend, the log alone),
and checks: the loaded layout hash equals the intended file's, the redundant slots and dispatch
algorithm are as intended, the recorder is off for a measurement run, and every rank (all DP
engines' workers) agrees with EP rank 0 on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import SceneEplbError
from ..formats import read_layout
from ..protocol import (
    AGREEMENT_KEYS,
    AUDITED_KEYS,
    OBSERVER_RECORDING,
    StartupLine,
    StatusAnswer,
    WorkerStatus,
    parse_startup_lines,
)


@dataclass(frozen=True)
class ServerCheck:
    name: str
    ok: bool
    detail: str


def _check(name: str, expected, actual) -> ServerCheck:
    return ServerCheck(name, expected == actual, f"expected {expected}, server reports {actual}")


def log_records(path: str | Path) -> list[StartupLine]:
    """The startup lines of every worker in a server log."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise SceneEplbError(f"cannot read server log: {exc}", path) from None
    return parse_startup_lines(text)


def status_from_log(path: str | Path) -> StartupLine:
    """The first worker's startup line, for engines where the plugin has no status route
    (vLLM-Ascend); ``audit_server`` then checks every other worker's line against it."""
    records = log_records(path)
    if not records:
        raise SceneEplbError("no scene-eplb startup line in the server log", path)
    return records[0]


def _rank_checks(status: StatusAnswer) -> list[ServerCheck]:
    """Every rank against EP rank 0 (the checks of ``audit_server`` read EP rank 0), and their skipped passes."""
    own, ranks = status.status, status.ranks
    differ = sorted({k for r in ranks for k in AGREEMENT_KEYS if hasattr(r, k) and getattr(r, k) != getattr(own, k)})
    skipped = sum(r.skipped_passes for r in ranks)
    return [
        ServerCheck(
            "every rank agrees",
            status.ranks_agree,
            f"{len(ranks)} rank(s) (EP ranks {[r.ep_rank for r in ranks]}) report the same {', '.join(AGREEMENT_KEYS)}"
            if status.ranks_agree
            else f"ranks differ in {', '.join(differ) or 'a key'}",
        ),
        ServerCheck(
            "no skipped passes",
            skipped == 0,
            "every rank attributed the rows of every MoE layer pass it ran"
            if skipped == 0
            else f"{skipped} (MoE layer, pass) pairs went uncounted since startup on EP ranks "
            f"{[r.ep_rank for r in ranks if r.skipped_passes]} (rows not attributable to a "
            "rank's own tokens; the workers' log says why): a dump of such a record undercounts",
        ),
    ]


def audit_server(
    status: StatusAnswer | StartupLine,
    layout_path: str | None,
    dispatch: str | None,
    recorder: str | None,
    log_path: str | None = None,
) -> list[ServerCheck]:
    """Checks of ``status`` (the status route's answer, or where there is none the first worker's
    startup line) and the log's startup lines against the intended layout and settings."""
    layout = read_layout(layout_path) if layout_path else None
    own = status.status if isinstance(status, StatusAnswer) else status
    expected = {
        "layout_hash": layout.digest() if layout else None,
        "redundant_slots": layout.geometry.num_redundant if layout else 0,
    }
    checks = [
        _check("layout hash", expected["layout_hash"], own.layout_hash),
        _check("redundant slots", expected["redundant_slots"], own.redundant_slots),
    ]
    if dispatch:
        checks.append(_check("dispatch algorithm", dispatch if layout else None, own.dispatch))
    if recorder:
        recording = isinstance(own, WorkerStatus) and own.recording
        checks.append(_check("recorder", recorder, OBSERVER_RECORDING if recording else own.observer))
    if isinstance(status, StatusAnswer):
        checks += _rank_checks(status)
    if log_path:
        records = log_records(log_path)
        if not records:
            checks.append(ServerCheck("startup log", False, f"no scene-eplb startup line in {log_path}"))
        for i, rec in enumerate(records):
            same = all(getattr(rec, k) == getattr(own, k) for k in AUDITED_KEYS)
            checks.append(ServerCheck(f"startup log line {i + 1}", same, f"worker logged {rec.to_wire()}"))
    return checks
