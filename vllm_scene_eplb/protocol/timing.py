"""The timing window ``advise`` prices: a status answer's ``live.time`` (or its record's own
window) read and checked as a whole, with the server it came from."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SceneEplbError
from .fields import _Fields, _floats, _non_negative
from .live import LiveTime, _active_slots, _critical, _wait_share
from .pass_groups import PassGroup, check_groups, read_groups
from .routes import LIVE_KEY
from .status import _STATUS_FIELDS
from .status_answer import StatusAnswer

# The status answer's ``live.time`` object as ``advise`` reads it, checked where it is read: a
# timing window with NaN, a negative time or a step shorter than the MoE time in it is refused
# with the field named, never priced. Stdlib only, like the rest of the protocol.

# What a timing window says about the server it came from; a dump's metadata carries the same keys,
# and ``advise`` refuses to price a dump with the timing of another layout, geometry or role.
PROVENANCE_KEYS = ("layout_hash", "ep_size", "redundant_slots", "role", "dispatch", "steps_per_entry", "engine", "plugin_version")


def _provenance(said: dict, window: _Fields) -> dict:
    """Every one of ``PROVENANCE_KEYS`` from ``said`` (the window's own provenance over the status
    keys around it), each read as the status reads it; a key left out is refused with the window
    named: absent is not null (``layout_hash`` null is the linear layout, a value)."""
    missing = [k for k in PROVENANCE_KEYS if k not in said]
    if missing:
        window.fail(
            f"does not say its {', '.join(missing)} (provenance): a window must say which server, layout and role it "
            "came from, and a key left out is not read as null (the linear layout)"
        )
    f = _Fields(said, f"{window.what}'s provenance", window.source, window.prefix)
    return {k: _STATUS_FIELDS[k](f, k) for k in PROVENANCE_KEYS}


@dataclass(frozen=True)
class TimingWindow:
    """One window's MoE timing over every rank, what ``advise`` prices a layout with.

    Shapes: R EP ranks (in EP rank order), L_moe MoE layers (in order); every [R][L_moe] is a
    tuple of R tuples of L_moe floats, means per pass over the window's passes.

    - ``rank_ms``: [R][L_moe] local expert ms per pass.
    - ``rank_assignments``: [R][L_moe] the assignments each rank computed per pass (the x of
      advise's count -> time model).
    - ``step_ms``: the mean wall ms of a step (at least the MoE ms a rank spends in it).
    - ``provenance``: dict, every one of ``PROVENANCE_KEYS``: the server it came from (a window that
      leaves one out is refused, never read as the linear layout; ``layout_hash`` None *is* the
      linear layout).
    - ``moe_share``: the MoE part of the step time, in [0, 1], or None.
    - ``sub_windows``: the step ms of the server's recent windows (their spread is a measured noise
      floor).
    - ``record``: whether it is a record's own window (``live.record_time``: the passes of that
      record's dump) rather than a live window that falls where it falls.
    - ``gap_ms``: the mean busy pause between steps (what a step's throughput pays beside the step;
      0 where not timed).
    - ``rank_active_slots``: [R][L_moe] the mean slots per pass each rank computed at least one
      assignment for (whose weights it read), or None where the server does not capture them (the
      model then prices no cost per active slot).
    - ``wait_share``: the largest share of a rank's step time its stepping thread waited on a run
      queue (other work on its core), or None where not read.
    - ``pass_groups``: the window's passes by size (``PassGroup``, each with its own [R][L_moe]
      means: where they differ in size, the cost per assignment and per active slot are fitted
      across them).
    - ``critical_ms``: a record's own window's MoE critical path measured pass by pass (per pass
      and layer the slowest rank, summed over layers, the mean over its logged passes: what ``advise``
      prices as ``critical_ms_now``), or None where the server did not log its passes.

    Example: EP 2, two MoE layers, rank 0 hot in layer 0::

        rank_ms          = ((1.8, 1.1), (1.0, 1.1))        # [R][L_moe] ms per pass
        rank_assignments = ((90.0, 52.0), (38.0, 52.0))    # [R][L_moe] assignments per pass
        step_ms = 12.5; moe_share = 0.25                   # a quarter of a step in MoE
        ranks == 2; layers == 2                            # the properties
    """

    rank_ms: tuple[tuple[float, ...], ...]
    rank_assignments: tuple[tuple[float, ...], ...]
    step_ms: float
    provenance: dict
    moe_share: float | None = None
    sub_windows: tuple[float, ...] = ()
    record: bool = False
    gap_ms: float = 0.0
    rank_active_slots: tuple[tuple[float, ...], ...] | None = None
    wait_share: float | None = None
    pass_groups: tuple[PassGroup, ...] = ()
    critical_ms: float | None = None

    @property
    def ranks(self) -> int:
        return len(self.rank_ms)

    @property
    def layers(self) -> int:
        return len(self.rank_ms[0])

    @classmethod
    def from_wire(cls, doc, where: str = "timing", layers: int | None = None, record: bool = False) -> TimingWindow:
        """The window from a ``live.time`` object (or a saved ``to_wire``), checked: finite
        non-negative ms, a positive ``step_ms`` at least the MoE ms a rank spends in it, ``moe_share``
        in [0, 1], ``rank_ms`` and ``rank_assignments`` of one shape (with ``layers`` MoE layers when
        given), its own ``provenance`` complete; ``record``: it is a record's own window (as the
        object's ``record`` flag, where it has one, may also say)."""
        f = _Fields(doc, "timing", where, prefix="")
        for key in ("rank_ms", "rank_assignments", "step_ms"):
            if doc.get(key) is None:
                f.fail(f"has no {key}: the window saw no timed traffic")
        rank_ms, assignments = (
            _floats(f.matrix(key, _non_negative, "a finite non-negative number") or ()) for key in ("rank_ms", "rank_assignments")
        )
        step_ms = float(f.number("step_ms", 0))
        share = f.number("moe_share", 0, 1, nullable=True) if "moe_share" in doc else None
        sub_windows = () if doc.get("sub_windows") is None else tuple(map(float, f.numbers("sub_windows", 0)))
        said = f.obj("provenance", "provenance", default=None)
        record = record or ("record" in doc and f.flag("record"))
        gap = f.number("gap_ms", 0, nullable=True) if "gap_ms" in doc else None
        known = {} if said is None else said.doc
        active = _active_slots(f)
        return cls.checked(
            f,
            rank_ms,
            assignments,
            step_ms,
            share,
            sub_windows,
            known,
            layers,
            record,
            gap or 0.0,
            active and _floats(active),
            _wait_share(f),
            read_groups(f),
            _critical(f)[0],
        )

    @classmethod
    def checked(
        cls,
        f: _Fields,
        rank_ms: tuple[tuple[float, ...], ...],
        assignments: tuple[tuple[float, ...], ...],
        step_ms: float,
        share: float | None,
        sub_windows: tuple[float, ...],
        provenance: dict,
        layers: int | None,
        record: bool = False,
        gap_ms: float = 0.0,
        active: tuple[tuple[float, ...], ...] | None = None,
        wait_share: float | None = None,
        groups: tuple[PassGroup, ...] = (),
        critical_ms: float | None = None,
    ) -> TimingWindow:
        """The window of fields each read (``from_wire``, ``of_live_time``), checked as a whole:
        ``rank_ms`` and ``rank_assignments`` of one shape (``layers`` MoE layers when given), a
        positive ``step_ms`` at least the MoE ms a rank spends in it, ``active`` (the active slots, where
        given) of the same shape and at most the assignments, ``groups`` the window's own passes
        (``check_groups``); ``f`` names the window in an error."""
        shape = (len(rank_ms), len(rank_ms[0]))
        if (len(assignments), len(assignments[0])) != shape:
            f.fail(
                f"rank_assignments is [{len(assignments)}][{len(assignments[0])}], rank_ms [{shape[0]}][{shape[1]}]: "
                "one value per rank and MoE layer in both"
            )
        if layers is not None and shape[1] != layers:
            f.fail(f"has {shape[1]} MoE layers, the candidate {layers}")
        if active is not None:
            if (len(active), len(active[0])) != shape:
                f.fail(
                    f"rank_active_slots is [{len(active)}][{len(active[0])}], rank_ms [{shape[0]}][{shape[1]}]: one value per rank and MoE layer in both"
                )
            over = [(r, i) for r, row in enumerate(active) for i, k in enumerate(row) if k > assignments[r][i] * (1 + 1e-9)]
            if over:
                r, i = over[0]
                f.fail(
                    f"rank_active_slots[{r}][{i}] is {active[r][i]:g}, more than the {assignments[r][i]:g} assignments the rank "
                    "computed: a slot is active when it computes at least one"
                )
        check_groups(f, groups, assignments, active)
        rank_moe = max(sum(row) for row in rank_ms)
        if step_ms <= 0 or step_ms < rank_moe * (1 - 1e-9):
            f.fail(f"step_ms {step_ms:g} is not positive or shorter than the {rank_moe:g} ms of MoE a rank spends in it")
        return cls(
            rank_ms,
            assignments,
            step_ms,
            _provenance(provenance, f),
            None if share is None else float(share),
            sub_windows,
            record,
            float(gap_ms),
            active,
            None if wait_share is None else float(wait_share),
            groups,
            None if critical_ms is None else float(critical_ms),
        )

    @classmethod
    def of_live_time(cls, time: LiveTime, where: str, layers: int | None, around: dict, record: bool = False) -> TimingWindow:
        """A ``live.time`` object read off the wire as ``advise`` prices it (``checked``); ``around``: the status's
        provenance keys, where the window's own ``provenance`` does not say; ``record``: it is a
        record's own window."""
        f = _Fields({}, "timing", where, prefix="")
        if time.step_ms is None or time.rank_assignments is None:
            f.fail(f"has no {'step_ms' if time.step_ms is None else 'rank_assignments'}: the window saw no timed traffic")
        return cls.checked(
            f,
            _floats(time.rank_ms),
            _floats(time.rank_assignments),
            float(time.step_ms),
            time.moe_share,
            tuple(map(float, time.sub_windows)),
            {**around, **time.provenance},
            layers,
            record,
            time.gap_ms or 0.0,
            None if time.rank_active_slots is None else _floats(time.rank_active_slots),
            time.wait_share,
            time.pass_groups,
            time.critical_ms,
        )

    @classmethod
    def of_status(cls, status: StatusAnswer, where: str, layers: int | None = None) -> TimingWindow | None:
        """The window of a status answer read off the wire (its last record's own window where it
        has one, else the live window), its provenance from the status around it; None where the
        server has no timed window yet."""
        live = status.live
        if live is None:
            return None
        record = live.record_time is not None
        time = live.record_time if record else live.time
        if time is None:
            return None
        return cls.of_live_time(time, where, layers, {k: getattr(status.status, k) for k in PROVENANCE_KEYS}, record=record)

    @classmethod
    def from_status(cls, doc, where: str = "timing", layers: int | None = None) -> TimingWindow | None:
        """The window of a saved status answer (read and checked whole, as the status route's answer:
        ``of_status``), of its ``live`` object (the last record's own window, ``record_time``, where it
        has one, else ``time``) or of such a time object itself, which then says its own provenance;
        None where the server has no timed window yet."""
        if not isinstance(doc, dict):
            raise SceneEplbError("timing must be a JSON object (a status answer, its live object or live.time)", where)
        if LIVE_KEY in doc:
            return cls.of_status(StatusAnswer.from_wire(doc, where), where, layers)
        record = doc.get("record_time")
        timing = record if record is not None else doc.get("time", doc)
        return None if timing is None else cls.from_wire(timing, where, layers, record=record is not None)

    def to_wire(self) -> dict:
        return {
            "rank_ms": [list(r) for r in self.rank_ms],
            "rank_assignments": [list(r) for r in self.rank_assignments],
            "step_ms": self.step_ms,
            "provenance": dict(self.provenance),
            "moe_share": self.moe_share,
            "sub_windows": list(self.sub_windows),
            "record": self.record,
            "gap_ms": self.gap_ms,
            "rank_active_slots": None if self.rank_active_slots is None else [list(r) for r in self.rank_active_slots],
            "wait_share": self.wait_share,
            "pass_groups": [g.to_wire() for g in self.pass_groups],
            "critical_ms": self.critical_ms,
        }
