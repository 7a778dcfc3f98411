"""This vLLM worker's plugin state, and the null object that stands in when the flag is off.

``configure`` runs before the weights load (settings, layout checked against the model and the EP
size), ``bind`` after (observer and replica maps attached to the model's routers). The patches in
``patches`` ask ``current()`` for every decision; with the flag off it is ``NULL_RUNTIME``, whose
hooks pass straight through, so no patch checks "is the plugin on?" itself.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ... import __version__
from ...config import PluginConfig, kv_role_of, parse_config
from ...errors import SceneEplbError
from ...layout import Layout
from ...model_geometry import ModelGeometry, from_hf_config
from ...protocol import DUMP_META_KEYS, EXPORT_STATUS_ACTION, LIVE_ACTION, startup_line
from ...runtime.export import Exporter, export_group
from ...runtime.layout_check import layout_for_server
from ...runtime.observer import NullObserver, RoutingObserver
from ...runtime.replica_map import SourceRanks
from .version import check_engine_version, engine_version

logger = logging.getLogger("vllm.scene_eplb")
NOT_ENABLED = "the scene_eplb plugin is not enabled on this server (no scene_eplb in --additional-config)"


class NullRuntime:
    """The plugin off on this worker: no extra slots, no layout rows, no step work, control refused."""

    layout = None

    def extra_slots(self, num_experts: int) -> int:
        return 0

    def layer_row(self, layer_name: str) -> np.ndarray | None:
        return None

    def cpu_support(self) -> bool:
        return False

    def opaque_moe_forward(self) -> bool:
        return False

    def end_step(self, is_dummy: bool) -> None:
        pass

    def bind(self, model_runner) -> None:
        pass

    def control(self, action: str, *args) -> dict:
        return {"ok": False, "error": NOT_ENABLED, "http_status": 404}


NULL_RUNTIME = NullRuntime()


@dataclass
class WorkerRuntime:
    """This worker's plugin state: settings, the loaded layout, the observer and where it counts."""

    config: PluginConfig
    role: str
    model: ModelGeometry
    model_name: str
    ep_size: int
    ep_rank: int  # this worker's place in vLLM's EP group (DP x TP, DP-major)
    dp_rank: int
    dp_size: int
    tp_rank: int
    source: SourceRanks  # the EP ranks that route this worker's batch (the static table's source rows)
    contributes: bool  # False on TP ranks that route the same tokens as TP rank 0
    observer: RoutingObserver | NullObserver
    layout: Layout | None = None
    layout_path: str | None = None
    moe_layer_ids: list[int] = field(default_factory=list)
    exporter: Exporter | None = None  # set by configure()

    def status(self) -> dict:
        """What the status route and the startup log line report (``protocol.STATUS_KEYS``)."""
        obs = self.observer.status()
        return {
            "plugin_version": __version__,
            "engine": f"vllm {engine_version()}",
            "model": self.model_name,
            "role": self.role,
            "ep_size": self.ep_size,
            "ep_rank": self.ep_rank,
            "dp_rank": self.dp_rank,
            "tp_rank": self.tp_rank,
            "layout_hash": self.layout.digest() if self.layout else None,
            "layout_path": self.layout_path,
            "redundant_slots": self.layout.geometry.num_redundant if self.layout else 0,
            "dispatch": self.config.dispatch if self.layout else None,
            "observer": obs.state,
            "recording": obs.recording,
            "ring_entries": obs.ring_entries,
            "entries_written": obs.entries_written,
            "passes_recorded": obs.passes_recorded,
            "moe_layers": self.moe_layer_ids,
            **self.model.routing(),
        }

    # ------------------------------------------------------------ hooks the patches call

    def extra_slots(self, num_experts: int) -> int:
        """Physical slots to add to each MoE layer beyond vLLM's own count (the layout's redundant ones)."""
        if self.layout is None:
            return 0
        if num_experts != self.layout.geometry.num_experts:
            raise SceneEplbError(f"a MoE layer has {num_experts} experts, the layout {self.layout.geometry.num_experts}", self.layout_path)
        return self.layout.geometry.num_redundant

    def layer_row(self, layer_name: str) -> np.ndarray | None:
        """The layout's row for a MoE layer (which logical expert each slot loads), or None: linear."""
        if self.layout is None:
            return None
        from vllm.model_executor.models.utils import extract_layer_index

        return self.layout.physical_to_logical_map[extract_layer_index(layer_name)]

    def cpu_support(self) -> bool:
        """The plugin's CPU support (local-only experts, DP collectives) is on for flagged servers."""
        return True

    def opaque_moe_forward(self) -> bool:
        """With DP > 1 the gathered token count differs per step and rank, which torch.compile cannot
        trace through vLLM's MoE code; vLLM's own opaque ``moe_forward`` op (its choice on GPUs)
        keeps the MoE layer out of the traced graph. On CPU only: elsewhere vLLM already uses it."""
        return self.dp_size > 1

    def end_step(self, is_dummy: bool) -> None:
        self.observer.end_step(is_dummy)

    # ------------------------------------------------------------ after load: bind to the model

    def bind(self, model_runner) -> None:
        """Attach the observer, the replica maps and the checks to the loaded model."""
        from ...runtime.replica_map import layer_maps  # torch: imported once the engine runs

        runners = moe_runners(model_runner.model)
        self.moe_layer_ids = [int(r.layer_id) for r in runners]
        if tuple(self.moe_layer_ids) != tuple(self.model.moe_layers):
            raise SceneEplbError(f"model built MoE layers {self.moe_layer_ids}, its config says {list(self.model.moe_layers)}")
        device = model_runner.device
        if self.layout is not None:
            maps = layer_maps(self.layout, self.config.dispatch, device, self.source)
            g = self.layout.geometry
            own = list(range(self.ep_rank * g.slots_per_rank, (self.ep_rank + 1) * g.slots_per_rank))
            for r in runners:
                emap = r.routed_experts.expert_map
                if emap is None or emap.numel() != g.num_physical or (emap >= 0).nonzero().flatten().tolist() != own:
                    raise SceneEplbError(f"layer {r.layer_id}: vLLM gave EP rank {self.ep_rank} the slots "
                                         f"{None if emap is None else (emap >= 0).nonzero().flatten().tolist()} of "
                                         f"{None if emap is None else emap.numel()}; the layout needs slots {own[0]}-{own[-1]} "
                                         f"of {g.num_physical}")
                r.router._scene_eplb_map = maps[int(r.layer_id)]
        # Every role captures (live fitness); only the prefill role records (the ring, start/stop/dump).
        self.observer = RoutingObserver(len(runners), self.model.num_experts, self.config.ring_entries, device,
                                        records=self.role == "prefill", role=self.role)
        padding = getattr(model_runner, "is_padding", None)
        for idx, r in enumerate(runners):
            r.router.set_capture_fn(functools.partial(self.observer.capture, idx, padding_rows=padding))
        logger.info("%s", startup_line(self.status(), f"ep_rank {self.ep_rank}, dp_rank {self.dp_rank}, tp_rank {self.tp_rank}"))

    # ------------------------------------------------------------ control (collective_rpc)

    def control(self, action: str, *args) -> dict:
        """start | stop | dump EXPORT_ID | export_status EXPORT_ID | live | status. Returns between steps
        at once, never waits for a peer and never raises: errors come back as ``{"ok": False, ...}``."""
        try:
            if action == "status":
                return {"ok": True, **self.status()}
            if action == "start":
                self.observer.start()
            elif action == "stop":
                self.observer.stop()
            elif action == "dump":
                return {"ok": True, **self._begin_dump(*args)}
            elif action == EXPORT_STATUS_ACTION:
                return {"ok": True, **self.exporter.job(*args).to_dict()}
            elif action == LIVE_ACTION:
                return {"ok": True, **self._live()}
            else:
                raise SceneEplbError(f"unknown action {action!r}")
            return {"ok": True, **self.status()}
        except (SceneEplbError, TypeError) as exc:
            return {"ok": False, "error": str(exc), "http_status": 409}

    def _live(self) -> dict:
        """This rank's cumulative live counts [L_moe, E] (MoE layers in order) and whether they count."""
        live = self.observer.live_counts()
        if live is None:
            raise SceneEplbError("the model is not bound yet: no live counts")
        counts, passes = live
        return {"counts": counts.tolist(), "passes": passes, "contributes": self.contributes, "ep_rank": self.ep_rank,
                "moe_layers": self.moe_layer_ids}

    def _begin_dump(self, export_id: str, deadline: float) -> dict:
        """Freeze this rank's counts (a CPU copy) and hand them to the exporter's thread, which must
        finish by ``deadline`` (wall clock); a request that arrives after it starts nothing."""
        import torch

        if time.time() >= deadline:
            raise SceneEplbError(f"dump {export_id} reached this rank after its deadline: nothing started")
        ring = self.observer.snapshot()  # raises while recording / before any record, the same on every rank
        T, L, E = self.config.ring_entries, self.model.num_layers, self.model.num_experts
        local = torch.zeros((T, L, E), dtype=torch.int64)
        if self.contributes:
            local[:, self.moe_layer_ids] = ring.to("cpu", torch.int64)
        st = self.status()
        meta = {k: st[k] for k in DUMP_META_KEYS}
        meta.update(ring_wrapped=st["passes_recorded"] > T, recorded_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        path = Path(self.config.dump_dir) / f"counts-{self.role}-{export_id}.npz"
        job = self.exporter.begin(export_id, local, path, meta, (T, L, E), deadline)
        return {**job.to_dict(), "ep_rank": self.ep_rank, "shape": [T, L, E], "entries_written": st["entries_written"],
                "passes_recorded": st["passes_recorded"], "local_total": int(local.sum())}


def _export_group(ep_rank: int, ep_size: int, export_id: str, timeout_s: float):
    return export_group(export_id, ep_rank, ep_size, timeout_s)


_current: NullRuntime | WorkerRuntime = NULL_RUNTIME


def current() -> NullRuntime | WorkerRuntime:
    """This worker's runtime: a WorkerRuntime when the flag is on, else the null runtime."""
    return _current


def configure(vllm_config) -> NullRuntime | WorkerRuntime:
    """Read and check the plugin settings and layout against the model, before weights load."""
    global _current
    cfg = parse_config(vllm_config.additional_config)
    if cfg is None:
        _current = NULL_RUNTIME
        return _current
    check_engine_version()
    pc = vllm_config.parallel_config
    if pc.pipeline_parallel_size > 1:
        raise SceneEplbError("scene_eplb supports pipeline_parallel_size 1 only (each PP stage would need its own export)")
    role = cfg.resolve_role(kv_role_of(vllm_config))
    model = from_hf_config(vllm_config.model_config.hf_config.to_dict(), vllm_config.model_config.model)
    from vllm.distributed import get_ep_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    ep = get_ep_group()
    tp_rank, tp_size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    ep_size = ep.world_size if pc.enable_expert_parallel else 1  # the EP size a layout must be made for
    ep_rank = ep.rank_in_group if pc.enable_expert_parallel else 0
    seq_parallel = bool(pc.use_sequence_parallel_moe)
    # DP rank d's tokens are routed by its TP ranks, EP ranks d*tp .. d*tp+tp-1 (vLLM's numbering).
    source = SourceRanks(ep_rank, 1) if seq_parallel else SourceRanks(ep_rank - tp_rank, tp_size)
    rt = WorkerRuntime(cfg, role, model, str(vllm_config.model_config.model), ep_size, ep_rank, pc.data_parallel_rank,
                       pc.data_parallel_size, tp_rank, source, contributes=tp_rank == 0 or seq_parallel,
                       observer=NullObserver(role, cfg.ring_entries))
    # The export sums over every rank of vLLM's EP group (DP x TP), which exists with or without EP.
    rt.exporter = Exporter(functools.partial(_export_group, ep.rank_in_group, ep.world_size))
    if cfg.layout:
        rt.layout, rt.layout_path = load_layout_for(cfg.layout, model, ep_size, pc), cfg.layout
    _current = rt
    return rt


def load_layout_for(path: str, model: ModelGeometry, ep_size: int, pc) -> Layout:
    """Read ``path`` and refuse it unless it fits this model and this server's parallel geometry."""
    if not pc.enable_expert_parallel:
        raise SceneEplbError("scene_eplb.layout needs --enable-expert-parallel (a layout places experts on EP ranks)")
    if pc.enable_eplb:
        raise SceneEplbError("scene_eplb.layout and --enable-eplb both move experts: use one of them")
    if pc.enable_ep_weight_filter:
        raise SceneEplbError("scene_eplb.layout needs every rank to read all expert tensors: drop --enable-ep-weight-filter")
    if pc.expert_placement_strategy != "linear":
        raise SceneEplbError("scene_eplb.layout needs --expert-placement-strategy linear (rank r owns slots [r*S, (r+1)*S))")
    return layout_for_server(path, model, ep_size, model_layer_axis=True)  # slots are looked up by model layer index


def moe_runners(model) -> list:
    """The model's MoE runners in layer order."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    runners = [m for m in model.modules() if isinstance(m, MoERunner)]
    return sorted(runners, key=lambda r: r.layer_id)
