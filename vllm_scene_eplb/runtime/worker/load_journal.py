"""The load audit's evidence, the same on every engine: what each adapter records while the expert
weights load, and the audit it runs once they have loaded (``runtime.worker.load_audit`` is the judge).

- ``SourceTracer``: which checkpoint expert a tensor handed to an expert weight loader came from:
  the checkpoint tensors the model loader yields, registered by memory range as they pass
  (``trace_checkpoint``: vLLM's ``DefaultModelLoader``, which vLLM 0.32/0.33 and vLLM-Ascend's
  vLLM 0.23 both load through), so a view, chunk or unbind of one keeps its place;
- ``ExpertLoad``: one worker's load: the layout rows its slots must hold, the journal of expert
  writes (``write``: layer, slot, weight, shard and the traced source), the loader paths that ran
  and a Gloo group over the EP ranks;
- ``audit``: the journal against the expected rows over this worker's slots, then, where the layout
  replicates an expert on several EP ranks, every replica's fingerprint (``slot_fingerprints``: each
  slot's sum and sum of squares of every expert weight the journal saw written, scales and offsets
  included) against its expert's first slot: one SUM over the EP ranks, with a deadline.

Each adapter hooks its engine's expert weight loader (where the slot a write lands in is known) and
says which slots are this worker's; nothing here imports an engine.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import SceneEplbError
from . import load_audit
from .load_audit import UNTRACED, LoadAudit, LoadJournal

EXPERT_INDEX = re.compile(r"(?:^|\.)experts\.(\d+)\.")  # a per-expert checkpoint name: its expert
AUDIT_TIMEOUT_S = 120.0  # the cross-rank replica check's deadline (a peer that never loads is a refusal, not a hang)
_audit_ids = itertools.count()  # one Gloo group per audit: every rank audits its loads in the same order


@dataclass
class _Source:
    """One checkpoint tensor alive in the loader: its memory range and the checkpoint expert of each
    index along dim 0 (``order``; one entry for a per-expert tensor)."""

    ref: weakref.ref
    start: int
    end: int
    stride0: int
    order: tuple[int, ...]


@dataclass
class SourceTracer:
    """Which checkpoint expert a tensor handed to a weight loader came from: the model loader's
    yielded tensors by memory range (views, chunks and unbinds of them keep their place). Only the
    tensors still alive are kept: the loader works through a few at a time."""

    sources: list[_Source] = field(default_factory=list)
    current: str | None = None  # the checkpoint tensor the model's loader works on (the last yielded), None outside a load

    def register(self, name: str, tensor, order: tuple[int, ...] | None = None) -> None:
        """Note a checkpoint tensor ``name``: per expert (``experts.{e}.`` in the name) or fused
        [E, ...] along dim 0 (``order``: the checkpoint expert of each index, default the identity)."""
        if tensor.numel() == 0:
            return
        m = EXPERT_INDEX.search(name)
        if m is not None:
            order = (int(m.group(1)),)
        elif order is None:
            if tensor.dim() != 3 or "experts." not in name:
                return
            order = tuple(range(tensor.shape[0]))
        self.sources = [s for s in self.sources if s.ref() is not None]
        start = tensor.data_ptr()
        stride0 = tensor.stride(0) * tensor.element_size() if len(order) > 1 else 0
        self.sources.append(_Source(weakref.ref(tensor), start, start + tensor.numel() * tensor.element_size(), stride0, order))

    def expert_of(self, tensor) -> int:
        """The checkpoint expert ``tensor`` (a view of a registered tensor) holds, or ``UNTRACED``."""
        ptr = tensor.data_ptr()
        for s in reversed(self.sources):
            if s.ref() is not None and s.start <= ptr < s.end:
                return s.order[(ptr - s.start) // s.stride0] if s.stride0 else s.order[0]
        return UNTRACED


@dataclass
class ExpertLoad:
    """One worker's load: the layout rows its slots must hold (model layer -> the expert of each
    global slot; empty without a layout: linear), the journal of expert writes, the source tracer,
    the loader paths that ran (named in a refusal) and the EP group of the replica check."""

    rows: dict[int, np.ndarray]
    num_experts: int
    journal: LoadJournal = field(default_factory=LoadJournal)
    tracer: SourceTracer = field(default_factory=SourceTracer)
    loaders: set[str] = field(default_factory=set)
    calls: int = 0  # expert weight loader calls so far, whether they wrote or not (a mapping entry matched)
    group: Callable[[str, float], Any] | None = None  # a Gloo group over the EP ranks (export_id, timeout_s), EP > 1 only

    def write(self, layer: int, slot: int, weight_name: str, shard: str, source: int) -> None:
        """Journal one expert write: global ``slot`` of model ``layer`` got the weight ``weight_name``
        (its last dotted part is the parameter: ``w13_weight``, ``w13_weight_scale``, ...) from checkpoint
        expert ``source`` (the tracer's answer for the tensor written)."""
        self.journal.write(layer, slot, weight_name.rpartition(".")[2], shard, source)

    def loaders_named(self) -> str:
        """The loader paths that followed the layout, for the refusal (none: the model loads its own way)."""
        if self.loaders:
            return ", ".join(sorted(self.loaders))
        return "none of the covered loaders ran (the model maps its experts its own way)" if self.rows else "no layout"


Load = Callable[[], "ExpertLoad | None"]  # this worker's load (None: the flag is off), asked at each call


def trace_checkpoint(DefaultModelLoader, current_load: Load) -> None:
    """The checkpoint tensors vLLM's default model loader yields, registered with the tracer as they
    pass, the last one yielded the tracer's ``current`` until the next (idempotent)."""
    orig = DefaultModelLoader.get_all_weights
    if getattr(orig, "__scene_eplb_traced__", False):
        return

    @functools.wraps(orig)
    def get_all_weights(self, model_config, model):
        load = current_load()
        try:
            for name, tensor in orig(self, model_config, model):
                if load is not None:
                    load.tracer.register(name, tensor)
                    load.tracer.current = name
                yield name, tensor
        finally:
            if load is not None:
                load.tracer.current = None

    get_all_weights.__scene_eplb_traced__ = True  # type: ignore[attr-defined]
    DefaultModelLoader.get_all_weights = get_all_weights


WrittenSlot = Callable[[Any, int, Any, bool], "tuple[int, int] | None"]


def journal_writes(orig, current_load: Load, written_slot: WrittenSlot, loader: str | None = None):
    """An engine's expert weight loader ``orig`` (``(layer, param, loaded_weight, weight_name, shard_id,
    expert_id, return_success)``, as vLLM's) journalling every write it makes: ``written_slot(layer,
    expert_id, out, return_success)`` says which (model layer, global slot) the call wrote, None where it
    wrote nothing (the expert is not local); the written tensor's source is traced before the call.
    ``loader``: the loader path named in a refusal."""

    @functools.wraps(orig)
    def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
        load = current_load()
        if load is None:
            return orig(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success)
        load.calls += 1
        source = load.tracer.expert_of(loaded_weight)
        out = orig(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success)
        where = written_slot(self, expert_id, out, return_success)
        if where is not None:
            if loader is not None:
                load.loaders.add(loader)
            load.write(where[0], where[1], weight_name, str(shard_id), source)
        return out

    return weight_loader


def written_tensors(module, journal: LoadJournal, layer: int, local_slots: int) -> list:
    """The expert parameters the journal saw written in model ``layer`` (weights, scales, offsets)
    that the loaded ``module`` still holds with one row per local slot, in name order (a kernel
    format that drops or reshapes a weight after loading leaves it out of the fingerprint)."""
    out = []
    for name in sorted({w.param for w in journal.writes if w.layer == layer}):
        t = getattr(module, name, None)
        if t is not None and t.dim() >= 1 and t.shape[0] == local_slots:
            out.append(t.data)
    return out


def slot_fingerprints(weights: list, num_physical: int, slot_base: int, dtype=None):
    """[num_physical, 2 x len(weights)] float64: each local slot's (sum, sum of squares) of every
    tensor in ``weights`` (each [local slots, ...], e.g. ``w13_weight``, ``w13_weight_scale``) at its
    global place, zeros elsewhere (summed over ranks, every rank sees all). ``dtype``: where the sums
    are taken (default float64; a device without float64 sums in float32, the same for the same bytes)."""
    import torch

    dtype = dtype or torch.float64
    out = torch.zeros(num_physical, 2 * len(weights), dtype=torch.float64)
    for local in range(weights[0].shape[0] if weights else 0):
        parts = []
        for w in weights:
            a = w[local].to(dtype)
            parts += [a.sum(), (a * a).sum()]
        out[slot_base + local] = torch.stack(parts).double().cpu()
    return out


def audit(
    load: ExpertLoad,
    expected: dict[int, np.ndarray],
    local: list[int],
    weights: Callable[[int], list],
    where: str,
    dtype=None,
) -> LoadAudit:
    """The load audit on this worker, after its weights loaded: the journal against ``expected``
    (model layer -> the expert each global slot must hold) over this worker's slots ``local`` (the
    same range in every MoE layer), then, where the layout replicates experts across EP ranks, every
    replica's fingerprint of ``weights(layer)`` (the layer's written expert tensors, [local slots, ...])
    against its expert's first slot: one SUM over the EP group's Gloo ranks, with a deadline, which also
    counts the ranks whose own journal failed, so that a refusal on one rank is a refusal on every rank
    (not a peer left waiting out the deadline). Raises the refusal; returns what it checked."""
    import torch
    import torch.distributed as dist

    from .export import allreduce

    problems = load_audit.write_problems(load.journal, expected, local)
    context = f"{where}, loaders: {load.loaders_named()}"
    checked = LoadAudit(len(local) * len(expected), len(load.journal.writes), None)
    replicas = load_audit.replicated_slots(expected) if load.rows else 0
    if not replicas or load.group is None:
        load_audit.refuse(problems, context)
        return checked  # no expert has a second replica: no fingerprint to compute or exchange
    base = local[0] if local else 0
    layers = list(expected)
    prints = [slot_fingerprints(weights(layer), len(expected[layer]), base, dtype) for layer in layers]
    refusing = torch.tensor([1.0 if problems else 0.0], dtype=torch.float64)
    total = torch.cat([refusing, *(p.flatten().double() for p in prints)])  # one flat SUM: layers fingerprint different weights
    try:
        group = load.group(f"load-audit-{next(_audit_ids)}", AUDIT_TIMEOUT_S)  # the world's store is new each start
        allreduce(group, total, dist.ReduceOp.SUM)
    except RuntimeError as exc:  # Gloo's deadline: a peer failed before the check, or hangs
        load_audit.refuse(problems, context)
        raise SceneEplbError(
            f"load audit ({where}): the cross-rank replica check did not complete within {AUDIT_TIMEOUT_S:.0f} s "
            f"(a peer EP rank failed or hung before it: see its log): not serving ({exc})"
        ) from exc
    load_audit.refuse(problems, context)
    others = int(total[0]) - int(refusing[0])
    if others:
        raise SceneEplbError(
            f"load audit ({where}): {others} other EP rank(s) found experts in the wrong slots (their logs name the "
            "slots): no rank serves a layout another rank loaded wrong"
        )
    problems, at = [], 1
    for layer, p in zip(layers, prints):
        summed = total[at : at + p.numel()].reshape(p.shape).numpy()
        at += p.numel()
        problems += load_audit.replica_problems(summed[None], expected, [layer])
    load_audit.refuse(problems, f"{where}, across EP ranks")
    return dataclasses.replace(checked, replicas=replicas)
