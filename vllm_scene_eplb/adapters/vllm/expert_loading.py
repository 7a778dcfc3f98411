"""Where a layout reaches vLLM's expert weights, and the journal the load audit reads.

vLLM 0.32 and 0.33 load MoE experts by three paths, and a layout must steer each (slot p loads the
checkpoint expert ``row[p]``, the redundant slots included):

1. ``RoutedExperts.get_expert_mapping`` (``MoERunner.load_weights``: Qwen3-MoE, Mixtral, GLM-4.5):
   its physical -> logical map is the layout's row (``patch_expert_mapping``);
2. the legacy ``RoutedExperts.make_expert_params_mapping`` that hand-written ``load_weights`` call
   (DeepSeek-V2/V3/R1, V4, Kimi-K2, Llama4, gpt-oss, ...): one flat mapping for the whole model with no
   redundant slots; under a layout it becomes one mapping per MoE layer, each entry qualified with
   the layer's module path and built on that layer's row with the layout's redundant slots, which a
   loader iterating it sees as the entries of the checkpoint tensor it is at (``ScopedMapping``);
3. fused 3-D checkpoints (``experts.gate_up_proj`` [E, ...]: Qwen3-VL-MoE, Aria), which vLLM loads
   as slot e <- expert e without a mapping: the tensor is reordered by the row first.

Every expert write goes through ``RoutedExperts.weight_loader``, where the journal records the slot,
the weight, the shard and the checkpoint expert the written tensor came from (``runtime.worker.load_journal``:
the tracer, the journal and the audit every engine shares). ``runtime.worker.load_audit`` judges it.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...errors import SceneEplbError
from ...runtime.worker import load_journal
from ...runtime.worker.load_audit import LoadAudit
from ...runtime.worker.load_journal import EXPERT_INDEX, ExpertLoad

# test-only: "LAYER:SLOT_A:SLOT_B" (several, comma-separated) makes the loaders swap the experts of two
# slots of LAYER (a loader bug on purpose, which the audit must refuse; every expert is still loaded
# somewhere); with ":serve" after them the worker serves the bug anyway, its audit's refusal logged and
# reported as ``refused`` (what an end-to-end check must catch in the answers and in ``scene-eplb audit``)
MISLOAD_ENV = "SCENE_EPLB_TEST_MISLOAD"
MISLOAD_SERVES = "serve"


def misload() -> tuple[tuple[tuple[int, int, int], ...], bool] | None:
    """The test-only mis-load ``MISLOAD_ENV`` names: its (layer, slot a, slot b) swaps and whether the
    worker serves them, or None."""
    spec = os.environ.get(MISLOAD_ENV)
    if not spec:
        return None
    body, serves = (spec[: -len(MISLOAD_SERVES) - 1], True) if spec.endswith(f":{MISLOAD_SERVES}") else (spec, False)
    swaps = [part.split(":") for part in body.split(",")]
    if not all(len(p) == 3 and all(x.isdigit() for x in p) for p in swaps):
        raise SceneEplbError(f"{MISLOAD_ENV} must be LAYER:SLOT_A:SLOT_B[,...][:{MISLOAD_SERVES}], got {spec!r}")
    return tuple((int(layer), int(a), int(b)) for layer, a, b in swaps), serves


@dataclass
class ExpertLoading(ExpertLoad):
    """One worker's load (``ExpertLoad``: the layout rows, the journal of expert writes, the source
    tracer, the loader paths that ran), and the rows vLLM's loaders follow (model layer -> row)."""

    def loading_row(self, layer: int) -> np.ndarray | None:
        """The row a loader follows for ``layer``: the layout's, or the test-only mis-load of ``MISLOAD_ENV``."""
        row = self.rows.get(layer)
        bug = misload()
        if row is None or bug is None:
            return row
        for bad_layer, a, b in bug[0]:
            if max(a, b) >= len(row):
                raise SceneEplbError(
                    f"{MISLOAD_ENV} must be LAYER:SLOT_A:SLOT_B with slots below {len(row)}, got {os.environ[MISLOAD_ENV]!r}"
                )
            if bad_layer == layer:
                row = row.copy()
                row[[a, b]] = row[[b, a]]
        return row


def _layer_of(layer_name: str) -> int:
    from vllm.model_executor.models.utils import extract_layer_index

    return extract_layer_index(layer_name)


def with_row(EplbState, row, build):
    """``build()`` with vLLM's initial physical -> logical map swapped for ``row`` (which every
    expert-mapping builder reads), restored after."""
    saved = EplbState.__dict__["build_initial_global_physical_to_logical_map"]
    EplbState.build_initial_global_physical_to_logical_map = staticmethod(lambda E, R: [int(x) for x in row])
    try:
        return build()
    finally:
        EplbState.build_initial_global_physical_to_logical_map = saved


Loading = Callable[[], "ExpertLoading | None"]  # this worker's load (None: the flag is off), asked at each call


def patch_expert_mapping(RoutedExperts, EplbState, current_loading: Loading) -> None:
    """Path 1: ``get_expert_mapping`` built on the layer's row (its redundant slots are vLLM's own count)."""
    orig = RoutedExperts.get_expert_mapping

    @functools.wraps(orig)
    def get_expert_mapping(self, *args, **kwargs):
        loading = current_loading()
        row = None if loading is None else loading.loading_row(_layer_of(self.layer_name))
        if loading is None or row is None:
            return orig(self, *args, **kwargs)
        loading.loaders.add("get_expert_mapping")
        return with_row(EplbState, row, lambda: orig(self, *args, **kwargs))

    RoutedExperts.get_expert_mapping = get_expert_mapping


CHECKPOINT_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # a checkpoint tensor's model layer


class ScopedMapping(list):
    """The legacy mapping under a layout: the whole model's entries, each qualified with its layer's
    module path (a list, as vLLM's loaders expect), iterated as the entries of the checkpoint tensor
    being loaded (the tracer's ``current``): its layer's entries for its expert, its replicas' slots,
    instead of all of them, which the loaders scan once per expert tensor not on the rank.

    Exact whatever the guess: a name matches only its layer's entries for its expert, and a match calls
    the expert weight loader (``ExpertLoad.calls``); where the guessed entries called nothing, the rest
    of the list follows in order. Where the layer or the expert is not known, the whole list."""

    def __init__(self, entries: list, loading: ExpertLoading):
        super().__init__(entries)
        self.loading = loading
        self.groups: dict[tuple[int, int], list] = {}  # (model layer, checkpoint expert) -> its entries, as in the list
        for entry in entries:
            layer, expert = CHECKPOINT_LAYER.search(entry[1]), EXPERT_INDEX.search(entry[1])
            if layer is not None and expert is not None:
                self.groups.setdefault((int(layer.group(1)), int(expert.group(1))), []).append(entry)

    def scope_now(self) -> tuple[int, int] | None:
        """The (model layer, checkpoint expert) of the checkpoint tensor the loader is at, None where not known."""
        name = self.loading.tracer.current
        if name is None:
            return None
        layer, expert = CHECKPOINT_LAYER.search(name), EXPERT_INDEX.search(name)
        return None if layer is None or expert is None else (int(layer.group(1)), int(expert.group(1)))

    def __iter__(self):
        scope = self.scope_now()
        group = None if scope is None else self.groups.get(scope)
        if group is None:
            return super().__iter__()
        return itertools.chain(group, self._rest_unless_matched(group, self.loading.calls))

    def _rest_unless_matched(self, group: list, calls: int):
        """The entries outside ``group``, in order, where none of ``group``'s reached a weight loader
        since ``calls`` (the tensor is not of that scope, or nothing of it loads here)."""
        if self.loading.calls != calls:
            return
        skip = {id(e) for e in group}
        yield from (e for e in super().__iter__() if id(e) not in skip)


def moe_layers(model, RoutedExperts) -> list[tuple[str, int]]:
    """Each MoE layer of ``model``: its module path and its model layer."""
    return [(name, _layer_of(m.layer_name)) for name, m in model.named_modules() if isinstance(m, RoutedExperts)]


def qualified_mapping(loading: ExpertLoading, EplbState, orig, model, args: tuple, layers: list) -> ScopedMapping | None:
    """The legacy mapping under a layout: per MoE layer of ``model`` (``layers``: module path, model
    layer), the entries ``orig`` builds on its row (with the redundant slots), both names prefixed
    with the layer's module path; None where no layer has a row."""
    gate, down, up, num_experts, _redundant, prefix = args
    out: list = []
    for name, layer in layers:
        row = loading.loading_row(layer)
        if row is None:
            continue
        if num_experts != loading.num_experts:
            raise SceneEplbError(
                f"{type(model).__name__}.load_weights maps {num_experts} experts per layer (make_expert_params_mapping), "
                f"the layout {loading.num_experts}: fused shared experts are not covered with a layout"
            )
        redundant = len(row) - num_experts
        entries = with_row(EplbState, row, functools.partial(orig, model, gate, down, up, num_experts, redundant, prefix))
        module_path = name + "."
        param_stem = entries[0][0][: -len("w13_")] if entries and entries[0][0].endswith("w13_") else None
        if param_stem is None or not module_path.endswith(param_stem):
            raise SceneEplbError(
                f"{type(model).__name__}.load_weights: its expert mapping (make_expert_params_mapping) names parameters "
                f"{entries[0][0] if entries else '(none)'!r} that the MoE layer at {name} does not hold; this loader is not "
                "covered by scene_eplb: serve the model without a layout"
            )
        base = module_path[: -len(param_stem)]
        out.extend((base + p, base + w, e, s) for p, w, e, s in entries)
    return ScopedMapping(out, loading) if out else None


def patch_legacy_mapping(RoutedExperts, EplbState, current_loading: Loading) -> None:
    """Path 2: ``RoutedExperts.make_expert_params_mapping`` (what ``fused_moe_make_expert_params_mapping``
    calls) qualified per MoE layer under a layout."""
    orig = RoutedExperts.__dict__["make_expert_params_mapping"].__func__

    @functools.wraps(orig)
    def make_expert_params_mapping(
        model,
        ckpt_gate_proj_name,
        ckpt_down_proj_name,
        ckpt_up_proj_name,
        num_experts,
        num_redundant_experts=0,
        routed_experts_prefix="routed_experts",
    ):
        args = (
            ckpt_gate_proj_name,
            ckpt_down_proj_name,
            ckpt_up_proj_name,
            num_experts,
            num_redundant_experts,
            routed_experts_prefix,
        )
        loading = current_loading()
        if loading is None or not loading.rows:
            return orig(model, *args)
        loading.loaders.add(f"{type(model).__name__}.load_weights via make_expert_params_mapping")
        mapping = qualified_mapping(loading, EplbState, orig, model, args, moe_layers(model, RoutedExperts))
        return orig(model, *args) if mapping is None else mapping

    RoutedExperts.make_expert_params_mapping = staticmethod(make_expert_params_mapping)


def patch_fused_checkpoints(RoutedExperts, current_loading: Loading) -> None:
    """Path 3: a fused 3-D expert tensor reordered by the layer's row before vLLM's loader reads it
    as slot e <- index e (registered with the tracer in its new order)."""
    orig = RoutedExperts.load_weights

    @functools.wraps(orig)
    def load_weights(self, weights):
        loading = current_loading()
        if loading is None:
            return orig(self, weights)
        row = loading.loading_row(_layer_of(self.layer_name))
        return orig(self, _reordered(loading, self.layer_name, row, weights))

    RoutedExperts.load_weights = load_weights


def _reordered(loading: ExpertLoading, layer_name: str, row, weights):
    import torch

    for name, w in weights:
        if row is not None and w.dim() == 3 and EXPERT_INDEX.search(f"{layer_name}.{name}") is None:
            loading.loaders.add("fused 3-D expert tensors")
            w = w.index_select(0, torch.as_tensor(row, dtype=torch.long, device=w.device))
            loading.tracer.register(name, w, tuple(int(x) for x in row))
        yield name, w


def _written_slot(experts, expert_id, out, return_success):
    """The (model layer, physical slot) a ``RoutedExperts.weight_loader`` call wrote: vLLM's mapping hands
    it the physical slot; None where the slot is not this rank's."""
    written = bool(out) if return_success else experts._map_global_expert_id_to_local_expert_id(expert_id) != -1
    return (_layer_of(experts.layer_name), int(expert_id)) if written else None


def patch_weight_loader(RoutedExperts, current_loading: Loading) -> None:
    """Every expert write journalled: slot, weight, shard, and the checkpoint expert it came from."""
    weight_loader = load_journal.journal_writes(RoutedExperts.weight_loader, current_loading, _written_slot)
    RoutedExperts.weight_loader = weight_loader  # functools.wraps kept vLLM's mark (supports_moe_loading)


def audit_load(loading: ExpertLoading, runners: list, where: str) -> LoadAudit:
    """The load audit on this worker, after its weights loaded (``load_journal.audit``): the journal
    against the expected rows (the layout's, or linear) over this worker's slots, then the replicas
    across EP ranks, fingerprinted on every expert weight written (scales included). Raises the
    refusal; returns what it checked."""
    expected: dict[int, np.ndarray] = {}  # model layer -> the expert each slot must hold
    modules: dict[int, object] = {}
    local: list[int] = []  # this worker's slots (the same range in every MoE layer)
    for r in runners:
        experts = r.routed_experts
        emap = experts.expert_map
        num_physical = experts.w13_weight.shape[0] if emap is None else emap.numel()
        layer = _layer_of(experts.layer_name)
        row = loading.rows.get(layer)
        expected[layer] = np.arange(num_physical) % loading.num_experts if row is None else row
        modules[layer] = experts
        local = list(range(num_physical)) if emap is None else (emap >= 0).nonzero().flatten().tolist()

    def weights(layer: int) -> list:
        return load_journal.written_tensors(modules[layer], loading.journal, layer, len(local))

    return load_journal.audit(loading, expected, local, weights, where)
