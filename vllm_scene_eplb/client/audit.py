"""`scene-eplb audit`: check that a running server loaded what was intended (SPEC §3 step 6).

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
from ..protocol import AGREE_KEY, AGREEMENT_KEYS, AUDITED_KEYS, OBSERVER_RECORDING, RANKS_KEY, parse_startup_lines


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _check(name: str, expected, actual) -> Check:
    return Check(name, expected == actual, f"expected {expected}, server reports {actual}")


def log_records(path: str | Path) -> list[dict]:
    """The startup lines of every worker in a server log."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise SceneEplbError(f"cannot read server log: {exc}", path) from None
    return parse_startup_lines(text)


def status_from_log(path: str | Path) -> dict:
    """The first worker's startup line as a status dict, for engines where the plugin has no status
    route (vLLM-Ascend); ``audit`` then checks every other worker's line against it."""
    records = log_records(path)
    if not records:
        raise SceneEplbError("no scene-eplb startup line in the server log", path)
    return dict(records[0])


def audit(
    status: dict, layout_path: str | None, dispatch: str | None, recorder: str | None, log_path: str | None = None
) -> list[Check]:
    """Checks of ``status`` (and the log's startup lines) against the intended layout and settings."""
    layout = read_layout(layout_path) if layout_path else None
    expected = {
        "layout_hash": layout.digest() if layout else None,
        "redundant_slots": layout.geometry.num_redundant if layout else 0,
    }
    checks = [
        _check("layout hash", expected["layout_hash"], status.get("layout_hash")),
        _check("redundant slots", expected["redundant_slots"], status.get("redundant_slots")),
    ]
    if dispatch:
        checks.append(_check("dispatch algorithm", dispatch if layout else None, status.get("dispatch")))
    if recorder:
        checks.append(_check("recorder", recorder, OBSERVER_RECORDING if status.get("recording") else status.get("observer")))
    ranks = status.get(RANKS_KEY)
    if ranks is not None:  # the status route: the checks above read EP rank 0; agreement extends them to every rank
        differ = sorted({k for r in ranks for k in AGREEMENT_KEYS if k in r and r[k] != status.get(k)})
        checks.append(
            Check(
                "every rank agrees",
                bool(status.get(AGREE_KEY)),
                f"{len(ranks)} rank(s) (EP ranks {[r.get('ep_rank') for r in ranks]}) report the same {', '.join(AGREEMENT_KEYS)}"
                if status.get(AGREE_KEY)
                else f"ranks differ in {', '.join(differ) or 'a key'}",
            )
        )
        skipped = sum(r.get("skipped_passes") or 0 for r in ranks)
        checks.append(
            Check(
                "no skipped passes",
                skipped == 0,
                "every rank attributed the rows of every MoE layer pass it ran"
                if skipped == 0
                else f"{skipped} (MoE layer, pass) pairs went uncounted since startup on EP ranks "
                f"{[r.get('ep_rank') for r in ranks if r.get('skipped_passes')]} (rows not attributable to a "
                "rank's own tokens; the workers' log says why): a dump of such a record undercounts",
            )
        )
    if log_path:
        records = log_records(log_path)
        if not records:
            checks.append(Check("startup log", False, f"no scene-eplb startup line in {log_path}"))
        for i, rec in enumerate(records):
            same = all(rec[k] == status.get(k) for k in AUDITED_KEYS)
            checks.append(Check(f"startup log line {i + 1}", same, f"worker logged {rec}"))
    return checks
