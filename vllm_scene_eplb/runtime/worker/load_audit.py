"""The load audit: after the weights load and before serving, every local physical slot must have
been written exactly once per expert weight and shard, from the checkpoint expert the layout names,
and every replica of one expert must hold the same weights. A loader that maps experts its own way
(a model's hand-written ``load_weights``, a fused 3-D checkpoint) would otherwise leave slots with
the wrong expert or unwritten, silently: the router sends tokens by the layout either way.

Engine-neutral: the adapters record each expert write (``LoadJournal.write``) and hand over the
slot fingerprints; this module only judges.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ...errors import SceneEplbError
from ...protocol import LOAD_AUDIT_PASSED, LOAD_AUDIT_REFUSED

UNTRACED = -1  # a write whose source tensor could not be traced to a checkpoint expert
MAX_LISTED = 6  # problems named in the refusal before "and N more"


@dataclass(frozen=True)
class SlotWrite:
    """One expert weight written into a physical slot: the MoE layer (model layer index), the global
    physical slot, the parameter and shard (``w13_weight`` / ``w1``), and the checkpoint expert it
    came from (``UNTRACED`` when the adapter could not tell)."""

    layer: int
    slot: int
    param: str
    shard: str
    source: int


@dataclass
class LoadJournal:
    """Every expert write of one worker's load, in order."""

    writes: list[SlotWrite] = field(default_factory=list)

    def write(self, layer: int, slot: int, param: str, shard: str, source: int) -> None:
        self.writes.append(SlotWrite(layer, slot, param, shard, source))


@dataclass(frozen=True)
class LoadAudit:
    """What the audit checked on this worker: slots, writes, and the replicas compared across ranks
    (None where there was nothing to compare: no layout, or no expert with two replicas); ``refused``
    where a test served a load the audit refused (the adapters' test-only planted mis-load)."""

    slots: int
    writes: int
    replicas: int | None
    refused: bool = False

    def summary(self) -> str:
        """The audit's word in the startup line and the status (one token, no spaces)."""
        if self.refused:
            return LOAD_AUDIT_REFUSED
        replicas = "" if self.replicas is None else f",{self.replicas}-replicas-identical"
        return f"{LOAD_AUDIT_PASSED}{self.slots}-slots,{self.writes}-writes{replicas}"


def write_problems(journal: LoadJournal, rows: dict[int, np.ndarray], local_slots: list[int]) -> list[str]:
    """What is wrong with the writes of each MoE layer in ``rows`` (layer -> the layout's row
    [num_physical]: the logical expert each slot must hold) over this worker's ``local_slots``:
    a slot never written, a weight/shard written twice or missing, a write from the wrong expert
    or from an untraced tensor. The weight/shard pairs a slot needs are those written to any slot
    of the layer (the loader's own set: gated or not, quantised scales or not)."""
    problems: list[str] = []
    by_layer: dict[int, list[SlotWrite]] = {}
    for w in journal.writes:
        by_layer.setdefault(w.layer, []).append(w)
    for layer, row in sorted(rows.items()):
        writes = by_layer.get(layer, [])
        needed = sorted({(w.param, w.shard) for w in writes})
        per_slot = Counter((w.slot, w.param, w.shard) for w in writes)
        for w in writes:
            want = int(row[w.slot])
            if w.source == UNTRACED:
                problems.append(
                    f"layer {layer} slot {w.slot} ({w.param} {w.shard}): written from a tensor the audit cannot "
                    f"trace to a checkpoint expert (should be expert {want})"
                )
            elif w.source != want:
                problems.append(
                    f"layer {layer} slot {w.slot} ({w.param} {w.shard}) holds expert {w.source}, should hold expert {want}"
                )
        for slot in local_slots:
            if not any(per_slot[(slot, p, s)] for p, s in needed):
                problems.append(f"layer {layer} slot {slot} was never written (should hold expert {int(row[slot])})")
                continue
            for p, s in needed:
                n = per_slot[(slot, p, s)]
                if n != 1:
                    problems.append(f"layer {layer} slot {slot} ({p} {s}) written {n} times, should be once")
    return (
        problems  # layers outside ``rows`` (a drafter's the plugin does not bind, loaded by the same runner) are not this audit's
    )


def replica_problems(fingerprints: np.ndarray, rows: dict[int, np.ndarray], layers: list[int], rtol: float = 1e-9) -> list[str]:
    """Replicas that differ: ``fingerprints`` [len(layers), num_physical, F] holds each slot's weight
    fingerprint as its owning rank computed it (the same function of the slot's contents on every
    rank); every slot of one logical expert must match the expert's first slot."""
    problems: list[str] = []
    for i, layer in enumerate(layers):
        row = rows[layer]
        for expert in np.unique(row):
            slots = np.flatnonzero(row == expert)
            ref = fingerprints[i, slots[0]]
            for s in slots[1:]:
                if not np.allclose(fingerprints[i, s], ref, rtol=rtol, atol=0.0):
                    problems.append(
                        f"layer {layer}: slots {int(slots[0])} and {int(s)} both hold expert {int(expert)} but their weights differ"
                    )
    return problems


def replicated_slots(rows: dict[int, np.ndarray]) -> int:
    """How many slots hold a second or later replica of an expert (what the cross-rank check compares)."""
    return int(sum(row.size - np.unique(row).size for row in rows.values()))


def refuse(problems: list[str], where: str) -> None:
    """Raise the audit's refusal naming the first problems (no-op when there are none)."""
    if not problems:
        return
    listed = "; ".join(problems[:MAX_LISTED])
    more = f"; and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    raise SceneEplbError(
        f"load audit ({where}): the experts in memory are not the ones the layout places, so the router would send "
        f"tokens to the wrong weights: {listed}{more}. The model's loader is not covered by scene_eplb "
        "(docs/vllm-runtime.md and docs/ascend.md list the covered loaders): serve it without a layout"
    )
