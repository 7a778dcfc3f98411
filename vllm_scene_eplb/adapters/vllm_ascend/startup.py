"""vLLM-Ascend startup wiring (vLLM 0.23 with vllm-ascend 0.23.0.post1).

- In the process that builds the engine config (``VllmConfig.__post_init__``, before vLLM-Ascend
  reads its ``eplb_config``): check the scene_eplb settings. For a layout run, check the layout
  against the model and the EP size, write it as vLLM-Ascend's ``expert_map_path`` JSON
  (atomically, named by the layout hash, in ``dump_dir``) and point
  ``additional_config.eplb_config.expert_map_path`` at it; vLLM-Ascend then builds every rank's
  expert map and loads the weights from it. The drafter's config (MTP), a copy of the server's,
  passes again on that file. A drafter with MoE layers needs the layout's drafter rows (refused
  without them, as on vLLM): ``tables.install_dispatch`` places its layers by them. A collection
  run (no layout) needs nothing here.
- In every process: vLLM-Ascend's ``generate_log2phy_map`` uses our ``static`` table (local replica
  first, the layout's fitted source counts) or, for ``dispatch: dynamic``, the virtual-id map that
  ``moe_hooks`` and ``dynamic`` turn into an even per-row split, when the current config carries a
  scene_eplb layout; its own formula otherwise. The recorder, its step boundary, the control RPC and
  the routes are ``patches``; a layout run journals every expert write (``expert_loading``) and
  audits the load when the worker binds, which logs the line ``scene-eplb audit`` reads.

Refused with a message when the config is built: a collection run under settings whose routed rows
the recorder cannot count (``refuse_unrecordable``); settings that would fight a layout (vLLM-Ascend's own dynamic EPLB, a
hand-set ``expert_map_path``, ``mix_placement``), PP > 1, ``VLLM_USE_V2_MODEL_RUNNER`` (on vLLM
0.23.0 vLLM-Ascend's NPUWorker ignores it and runs V1, whose step the plugin wires; the V2 runner
itself only rejects ``dynamic_eplb``: refused so the server's settings say what runs), a layout without expert parallelism, and with ``dynamic`` returning routed experts to
clients (they would see virtual ids).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from ...errors import SceneEplbError
from ...formats import write_layout
from ...layouts.layout import Layout
from ...planning.model_geometry import from_hf_config
from ...runtime.config import kv_role_of, parse_config, plugin_enabled, require_config
from ...runtime.layout_check import layout_for_server
from ..drafter import moe_drafter
from . import expert_loading, moe_hooks, patches
from .rows import unrecordable, unsupported_settings
from .server_layout import ep_size_of, layout_of, remember
from .tables import AscendDispatch, install_dispatch
from .version import check_versions
from .worker_plugin import current_load, ids_hook_for

logger = logging.getLogger("vllm.scene_eplb")
DRAFTER_LINE = "scene-eplb: the %s drafter's MoE layers load and route by the layout's drafter rows %s"


def check_drafter(vllm_config, layout: Layout) -> None:
    """Refuse a layout without rows for a speculative drafter that has MoE layers (DeepSeek's MTP
    layer): vLLM-Ascend would build them with the layout's slot count and place them by its default
    split, which no layout row says (as the vLLM adapter refuses it); with rows, say so."""
    method = moe_drafter(vllm_config)
    if method is None:
        return
    if not layout.drafter_layers:
        raise SceneEplbError(
            f"scene_eplb.layout with a speculative drafter that has MoE layers ({method}): the layout has no rows for "
            "them, and vLLM-Ascend would build them with the layout's slot count but place them by its default split: "
            "fit the layout on a dump recorded with the drafter on (or with `scene-eplb fit --drafter-layers N`), "
            "or serve it without the drafter"
        )
    logger.info(DRAFTER_LINE, method, list(layout.drafter_layers))


def prepare_layout_run(
    additional_config: dict, hf_config: dict, ep_size: int, kv_role: str | None = None, returns_routed_experts: bool = False
) -> tuple[Layout, Path]:
    """Check the settings and the layout, write the expert map file and set ``eplb_config`` to it.

    Returns (layout, expert_map_path); changes ``additional_config`` only when everything holds. A
    config that already points at the file this layout is written to passes again: vLLM builds the
    drafter's config (MTP) as a ``dataclasses.replace`` of the server's, which re-runs the hook on our write.
    """
    cfg = parse_config(additional_config)
    if cfg is None:
        raise SceneEplbError("scene_eplb is not enabled in additional_config")
    cfg.resolve_role(kv_role)  # kv_both needs an explicit role: fail here, not in a worker
    if cfg.layout is None:
        raise SceneEplbError("scene_eplb.layout is not set: a collection run has no layout to prepare")
    if cfg.dispatch == "dynamic" and returns_routed_experts:
        raise SceneEplbError(
            'scene_eplb.dispatch "dynamic" on vLLM-Ascend rewrites top-k ids to virtual replica ids, which '
            "enable_return_routed_experts would hand to clients: turn one of them off"
        )
    eplb = additional_config.get("eplb_config") or {}
    if not isinstance(eplb, dict):
        raise SceneEplbError("additional_config.eplb_config must be a JSON object")
    if eplb.get("dynamic_eplb") or eplb.get("expert_map_record_path"):
        raise SceneEplbError("scene_eplb.layout and vLLM-Ascend's dynamic EPLB both move experts: use one of them")
    if additional_config.get("mix_placement"):
        raise SceneEplbError("scene_eplb.layout places routed experts only: turn off mix_placement")
    layout = layout_for_server(
        cfg.layout, from_hf_config(hf_config), ep_size, model_layer_axis=False
    )  # the map file holds MoE rows only
    path = Path(cfg.dump_dir) / f"expert_map-{layout.digest()[:16]}.json"
    if eplb.get("expert_map_path") and eplb["expert_map_path"] != str(path):  # ours: a config copied from this one
        raise SceneEplbError(
            "eplb_config.expert_map_path is set by hand: give the layout as scene_eplb.layout only "
            "(the plugin writes the expert map from it)"
        )
    path = write_layout(layout, path, "vllm-ascend")
    additional_config["eplb_config"] = {**eplb, "expert_map_path": str(path)}
    return layout, path


def _dispatch_in_config() -> AscendDispatch | None:
    """The scene_eplb layout and dispatch of the config the model is being built with, or None."""
    from vllm.config import get_current_vllm_config

    vc = get_current_vllm_config()
    cfg = parse_config(vc.additional_config)
    if cfg is None or cfg.layout is None:
        return None
    return AscendDispatch(layout_of(vc), cfg.dispatch)


def check_run(vllm_config) -> None:
    """What any run with the flag needs, and for a layout run the expert map file (``prepare_layout_run``)."""
    import vllm.envs as envs

    cfg = require_config(vllm_config.additional_config)
    if envs.VLLM_USE_V2_MODEL_RUNNER:
        raise SceneEplbError(
            "scene_eplb supports vLLM-Ascend's V1 model runner only: set VLLM_USE_V2_MODEL_RUNNER=0 (on vLLM "
            "0.23.0 vLLM-Ascend's NPUWorker falls back to V1 anyway)"
        )
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        raise SceneEplbError("scene_eplb supports pipeline_parallel_size 1 only (vLLM-Ascend numbers MoE layers per PP stage)")
    role = cfg.resolve_role(kv_role_of(vllm_config))  # kv_both needs an explicit role: fail here, not in a worker
    if cfg.layout is None:
        logger.info("scene-eplb: collection run (role %s, %d ring entries, dumps in %s)", role, cfg.ring_entries, cfg.dump_dir)
        return
    layout, path = prepare_layout_run(
        vllm_config.additional_config,
        vllm_config.model_config.hf_config.to_dict(),
        ep_size_of(vllm_config.parallel_config),
        kv_role_of(vllm_config),
        bool(getattr(vllm_config.model_config, "enable_return_routed_experts", False)),
    )
    remember(cfg.layout, layout)  # read as layout_of reads it: a worker in this process reads it no more
    check_drafter(vllm_config, layout)
    logger.info(
        "scene-eplb: layout %s (%d redundant slots, %s dispatch) -> vLLM-Ascend expert_map_path %s",
        layout.digest(),
        layout.geometry.num_redundant,
        cfg.dispatch,
        path,
    )


def refuse_unrecordable(vllm_config) -> None:
    """A collection run under settings whose routed rows the recorder cannot tell apart
    (``rows.unsupported_settings``, read from vLLM-Ascend's config once its platform set it up) stops
    here, when the config is built: before any worker starts or loads a weight. A layout run serves
    on (its worker says the recorder is off). Where vLLM-Ascend's platform set up no config (a
    device that is not an NPU) the worker checks when it binds."""
    if require_config(vllm_config.additional_config).layout is not None:
        return
    try:
        refused = unsupported_settings(vllm_config)
    except RuntimeError:  # "Ascend config is not initialized": its platform skipped this config
        return
    if refused:
        raise unrecordable(refused)


def _wrap_config(vllm_config_cls) -> None:
    """Check the run (and prepare a layout run) before vLLM-Ascend's platform reads ``eplb_config``;
    once it has set up its config, refuse a collection run it cannot count (``refuse_unrecordable``)."""
    orig = vllm_config_cls.__post_init__

    @functools.wraps(orig)
    def __post_init__(self, *args, **kwargs):
        enabled = plugin_enabled(self.additional_config)
        if enabled:
            check_run(self)
        orig(self, *args, **kwargs)
        if enabled:
            refuse_unrecordable(self)

    vllm_config_cls.__post_init__ = __post_init__


def register(ascend: str, vllm_version: str) -> None:
    """The plugin on vLLM-Ascend: version check, config hook, dispatch replacement, MoE hooks,
    recorder wiring."""
    from vllm.config import VllmConfig

    check_versions(ascend, vllm_version)
    from vllm_ascend.eplb.core import eplb_utils

    _wrap_config(VllmConfig)
    install_dispatch(eplb_utils, _dispatch_in_config)
    moe_hooks.install(ids_hook_for)
    expert_loading.install(current_load)
    patches.install(ascend, vllm_version)
