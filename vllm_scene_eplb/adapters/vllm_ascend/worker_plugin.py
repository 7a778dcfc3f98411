"""This vLLM-Ascend worker's plugin state: the recorder on ``AscendFusedMoE``, and what each MoE
layer's ``select_experts`` ids go through.

``configure`` runs when the NPU model runner starts loading the model (settings, ranks, a layout
run's load journal), ``bind`` after (the model's and the speculative drafter's MoE layers found, a
layout run's load audit over both, the observers made, each layer given its capture).
The ids of every layer then pass ``LayerIds``: counted when the layer is a bound one (this rank's
own real rows only, ``rows``), then rewritten to virtual ids when the layer's ``log2phy`` was built
for ``dispatch: dynamic`` (``dynamic``). A drafter's MoE layers (DeepSeek's MTP layer) are counted
apart, as rows after the main model's layers (``RecorderPlugin.bind_drafter``): each of its passes
runs under vLLM-Ascend's forward context with ``num_actual_tokens`` its real rows (a drafter's dummy
run tells 0), so the same own-rows rule counts its real rows only. With a layout they load and
route by the layout's drafter rows (``tables``), which must be the layers the drafter built. With
the flag off the runtime is ``NULL_PLUGIN`` and no layer has a capture.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import SceneEplbError
from ...planning.model_geometry import from_hf_config
from ...protocol import COMM_METHOD_LINE, NativeCounts, WorkerAnswer, startup_line
from ...runtime.config import kv_role_of, parse_config
from ...runtime.worker.export import Exporter, group_maker
from ...runtime.worker.interfaces import LayerCapture, WorkerPlugin
from ...runtime.worker.observer import NullObserver
from ...runtime.worker.worker import NullPlugin, RecorderPlugin
from . import moe_time
from .dynamic import virtual_ids_for
from .expert_loading import AscendExpertLoad, audit_layers
from .moe_hooks import FUSED_MOE_MODULE
from .native_load import NativeWindow
from .rows import OwnRows, own_rows_from_context, unrecordable, unsupported_settings
from .server_layout import layout_of

logger = logging.getLogger("vllm.scene_eplb")
CAPTURE_ATTR = "_scene_eplb_capture"  # on a bound main-model layer: (ids) -> None
HOOK_ATTR = "_scene_eplb_ids_hook"  # on any layer, once worked out: its LayerIds or None
_UNSET = object()


NULL_PLUGIN = NullPlugin()


@dataclass(kw_only=True)
class AscendWorkerPlugin(RecorderPlugin):
    """A vLLM-Ascend worker's recorder state (``RecorderPlugin``) and its binding to the model."""

    own_rows: OwnRows  # where this rank's own real rows are in what it routes
    layers: list = field(default_factory=list)  # the bound main-model MoE layers, in order
    native: NativeWindow | None = None  # vLLM-Ascend's own counters over the last record
    timer: moe_time.MoeTimer | None = None  # time_moe: NPU event pairs around each layer's experts
    comm_seen: dict = field(default_factory=dict)  # MoE comm method -> real passes that ran it (eager passes)
    expert_load: AscendExpertLoad | None = None  # a layout run's load audit journal while the weights load (freed once audited)
    _pass_comm: str | None = None  # the comm method of the pass being run, where its Python ran

    def note_comm(self) -> None:
        """Remember the MoE comm method of the pass being run (host, at the first MoE layer: in eager
        passes every pass, under graphs only when captured, as a replay runs no Python)."""
        from vllm_ascend.ascend_forward_context import _EXTRA_CTX

        self._pass_comm = _EXTRA_CTX.moe_comm_type.name

    def end_step(self, is_dummy: bool) -> None:
        """``RecorderPlugin.end_step``; with ``time_moe`` the pass before's expert seconds first (read a
        step later, no wait in the forward); a real pass's comm method is tallied, and logged the first time."""
        if self.timer is not None:
            self.timer.flush(self.observer.add_moe_seconds)
        super().end_step(is_dummy)
        comm, self._pass_comm = self._pass_comm, None
        if comm is not None and not is_dummy:
            if comm not in self.comm_seen:
                logger.info(COMM_METHOD_LINE, comm)
            self.comm_seen[comm] = self.comm_seen.get(comm, 0) + 1

    def answer(self, action: str, *args) -> WorkerAnswer:
        """``RecorderPlugin.answer``; a record's start and stop also read vLLM-Ascend's own counters."""
        answer = super().answer(action, *args)
        if answer.ok and action in ("start", "stop") and self.native is not None:
            self.native.mark(action, self.layers)
        return answer

    def native_load(self) -> NativeCounts:
        return self.native.result if self.native is not None else super().native_load()

    def bind(self, model_runner) -> None:
        """Find the main model's and the drafter's MoE layers, audit a layout run's load, make the
        observers and give each layer its capture."""
        from vllm.model_executor.models.utils import extract_layer_index

        layers = moe_layers(model_runner.model)
        self.check_moe_layers([extract_layer_index(layer.layer_name) for layer in layers])
        drafter = drafter_moe_layers(model_runner)
        self.check_drafter_layers(len(drafter))
        if self.expert_load is not None:
            where = f"vLLM-Ascend, ep_rank {self.ep_rank}, dp_rank {self.dp_rank}, tp_rank {self.tp_rank}"
            self.load_audit = audit_layers(self.expert_load, layers + drafter, where)
            self.expert_load = None  # the journal and tracer are done with: free them
        self.layers, self.native = layers, NativeWindow(self.model.num_experts)
        refused = unsupported_settings(model_runner.vllm_config)
        if refused and self.layout is None:  # refused when its config was built, unless vLLM-Ascend had set up none then
            raise unrecordable(refused)
        if refused:  # a layout run: serving goes on; the recorder and live fitness have nothing to read
            logger.warning(
                "scene-eplb: no routing counts on this server (recorder and live fitness off) under %s", ", ".join(refused)
            )
            self.observer = NullObserver(self.role, self.config.ring_entries)
        else:
            observer = self.make_observer(model_runner.device, dp_size=signed_dp_size(model_runner.vllm_config))
            observer.reserve(largest_pass_ids(model_runner.vllm_config, self.model.top_k or 1))
            for idx, layer in enumerate(layers):
                layer.__dict__[CAPTURE_ATTR] = functools.partial(_capture, self, observer, idx)
            if drafter:
                self.bind_drafter_capture(model_runner, drafter)
            if self.config.time_moe:
                from vllm_ascend.ascend_config import get_ascend_config

                moe_time.refuse_fused_mc2(get_ascend_config())
                moe_time.install()
                self.timer = moe_time.MoeTimer()
                moe_time.bind(self.timer, layers)
        logger.info(
            "%s",
            startup_line(self.status(), f"vLLM-Ascend, ep_rank {self.ep_rank}, dp_rank {self.dp_rank}, tp_rank {self.tp_rank}"),
        )

    def check_drafter_layers(self, found: int) -> None:
        """With a layout, the drafter must have built one MoE layer for each of its drafter rows (each
        it built was placed by one, ``tables.drafter_placement``)."""
        if self.layout is not None and found != len(self.layout.drafter_layers):
            raise SceneEplbError(
                f"the speculative drafter built {found} MoE layers, the layout has drafter rows for layers "
                f"{drafter_layer_ids(self.model.num_layers, len(self.layout.drafter_layers))}: fit the layout on a "
                "dump recorded with this drafter on",
                self.layout_path,
            )

    def bind_drafter_capture(self, model_runner, layers: list) -> None:
        """The drafter's observer (stepped with the main model's, its rows after the model's layers)
        and each drafter MoE layer's capture: the same own-rows rule as the main layers'."""
        found = drafter_layer_ids(self.model.num_layers, len(layers))
        observer = self.bind_drafter(found, model_runner.device, dp_size=signed_dp_size(model_runner.vllm_config))
        observer.reserve(largest_pass_ids(model_runner.vllm_config, self.model.top_k or 1))
        for idx, layer in enumerate(layers):
            layer.__dict__[CAPTURE_ATTR] = functools.partial(_capture_rows, self.own_rows, observer, idx)


def drafter_layer_ids(num_layers: int, count: int) -> list[int]:
    """The model layer ids of a drafter's ``count`` MoE layers: the layers after the model's
    ``num_layers`` (DeepSeek-V3's MTP layer is layer ``num_hidden_layers``; V4's module names call it
    ``mtp.0``), as a layout's drafter rows and a dump's rows name them."""
    return list(range(num_layers, num_layers + count))


def drafter_moe_layers(model_runner) -> list:
    """The speculative drafter's ``AscendFusedMoE`` layers in construction order (vLLM-Ascend's MoE
    index, which picked their placement); none without a drafter, a model or MoE layers."""
    import importlib

    model = getattr(getattr(model_runner, "drafter", None), "model", None)
    if model is None:
        return []
    cls = importlib.import_module(FUSED_MOE_MODULE).AscendFusedMoE
    return sorted((m for m in model.modules() if isinstance(m, cls)), key=lambda m: m.moe_instance_id)


def largest_pass_ids(vllm_config, top_k: int) -> int:
    """The most (token, id) pairs one MoE layer routes in a pass: the batch budget (or the MC2
    capacity, if larger), DP-gathered under ALLGATHER, times top-k plus a shared-expert pseudo id."""
    from vllm_ascend.ascend_forward_context import get_mc2_tokens_capacity

    tokens = max(vllm_config.scheduler_config.max_num_batched_tokens, get_mc2_tokens_capacity() or 0)
    return tokens * vllm_config.parallel_config.data_parallel_size * (top_k + 1)


def signed_dp_size(vllm_config) -> int:
    """The DP size the observer's DP signature has: the engine's, where vLLM-Ascend all-reduces each
    step's tokens per DP rank (the same vector on every engine); 1 (no signature, dumps aligned by
    stamps alone) where it skips that all-reduce (MC2-only KV consumers: each rank's vector is local)."""
    from vllm_ascend.utils import should_skip_allreduce_across_dp_group

    dp = vllm_config.parallel_config.data_parallel_size
    return 1 if dp <= 1 or should_skip_allreduce_across_dp_group(vllm_config) else dp


def _capture(rt: AscendWorkerPlugin, observer: LayerCapture, moe_idx: int, ids) -> None:
    """Count this rank's own rows of the layer's ids, or mark the layer's pass skipped where the rows
    do not follow the comm method's rule (decided when traced: a captured graph replays it)."""
    if moe_idx == 0:
        rt.note_comm()
    _capture_rows(rt.own_rows, observer, moe_idx, ids)


def _capture_rows(own: OwnRows, observer: LayerCapture, moe_idx: int, ids) -> None:
    """Count this rank's own real rows of the layer's ids (``rows.own_rows_from_context``), or mark
    the layer's pass skipped."""
    mine = own_rows_from_context(own, ids)
    if mine is None:
        observer.skip(moe_idx)
    else:
        rows, real = mine
        observer.capture(moe_idx, ids[rows], own_rows=real)


class LayerIds:
    """One layer's ids hook: count them (main-model layers), then rewrite them (``dynamic``)."""

    def __init__(self, capture: Callable | None, rewrite: Callable | None):
        self.capture, self.rewrite = capture, rewrite

    def __call__(self, layer, topk_ids):
        if self.capture is not None:
            self.capture(topk_ids)
        return topk_ids if self.rewrite is None else self.rewrite(layer, topk_ids)


def ids_hook_for(layer) -> LayerIds | None:
    """The layer's ids hook (worked out at its first forward, which comes after ``bind``), or None."""
    hook = layer.__dict__.get(HOOK_ATTR, _UNSET)
    if hook is _UNSET:
        capture, rewrite = layer.__dict__.get(CAPTURE_ATTR), virtual_ids_for(layer)
        hook = None if capture is None and rewrite is None else LayerIds(capture, rewrite)
        layer.__dict__[HOOK_ATTR] = hook
    return hook


def moe_layers(model) -> list:
    """The model's ``AscendFusedMoE`` layers in layer order."""
    import importlib

    from vllm.model_executor.models.utils import extract_layer_index

    cls = importlib.import_module(FUSED_MOE_MODULE).AscendFusedMoE
    return sorted((m for m in model.modules() if isinstance(m, cls)), key=lambda m: extract_layer_index(m.layer_name))


_current: WorkerPlugin = NULL_PLUGIN


def current() -> WorkerPlugin:
    """This worker plugin: an AscendWorkerPlugin when the flag is on, else the null plugin."""
    return _current


def current_load() -> AscendExpertLoad | None:
    """This worker's load the expert weight loader journals into (None: the flag off, a collection run,
    or the load audited already)."""
    return _current.expert_load if isinstance(_current, AscendWorkerPlugin) else None


def configure(vllm_config, engine: str) -> WorkerPlugin:
    """Read the plugin settings and this worker's ranks, before the model loads."""
    global _current
    cfg = parse_config(vllm_config.additional_config)
    if cfg is None:
        _current = NULL_PLUGIN
        return _current
    from vllm.distributed import get_ep_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    pc = vllm_config.parallel_config
    role = cfg.resolve_role(kv_role_of(vllm_config))
    model = from_hf_config(vllm_config.model_config.hf_config.to_dict(), vllm_config.model_config.model)
    ep = get_ep_group()
    layout = layout_of(vllm_config) if cfg.layout else None  # the one vLLM-Ascend's log2phy maps are built from
    tp_rank, tp_size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    rt = AscendWorkerPlugin(
        config=cfg,
        role=role,
        engine=engine,
        model=model,
        model_name=str(vllm_config.model_config.model),
        ep_size=ep.world_size,
        ep_rank=ep.rank_in_group,
        dp_rank=pc.data_parallel_rank,
        tp_rank=tp_rank,
        contributes=True,  # every rank counts only its own rows (OwnRows): the sum counts each token once
        observer=NullObserver(role, cfg.ring_entries),
        layout=layout,
        layout_path=cfg.layout,
        exporter=Exporter(group_maker(ep.rank_in_group, ep.world_size)),
        own_rows=OwnRows(tp_rank, tp_size, pc.data_parallel_rank, pc.data_parallel_size),
    )
    if layout is not None:  # a collection run loads by vLLM-Ascend's own split, which the plugin does not touch
        rows = dict(zip(model.moe_layers, layout.physical_to_logical_map[list(layout.moe_layers)]))
        drafter = drafter_layer_ids(model.num_layers, len(layout.drafter_layers))
        rows.update({layer: layout.physical_to_logical_map[row] for layer, row in zip(drafter, layout.drafter_layers)})
        group = group_maker(ep.rank_in_group, ep.world_size) if ep.world_size > 1 else None
        layer_ids = list(model.moe_layers) + drafter  # by vLLM-Ascend's MoE index: the main model's, then the drafter's
        rt.expert_load = AscendExpertLoad(rows, model.num_experts, group=group, layer_ids=layer_ids)
    _current = rt
    return rt
