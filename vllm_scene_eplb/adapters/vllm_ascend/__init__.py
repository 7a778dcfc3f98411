"""vLLM-Ascend 0.23.0.post1 adapter (with vLLM 0.23).

- ``version``: the releases it was written for, and the refusal of any other;
- ``tables``: our layout and dispatch tables in vLLM-Ascend's terms (per-rank expert maps, log2phy);
- ``startup``: the config hook (the run's checks; a layout run's expert map file) and what it installs;
- ``moe_hooks``: the MoE layer being run and its ``select_experts`` ids (rebound in every module);
- ``dynamic``: the per-row replica choice of ``dispatch: dynamic`` on those ids;
- ``runtime``: the worker's recorder state, bound to the model's ``AscendFusedMoE`` layers;
- ``rows``: which routed rows are this rank's own real tokens, per MoE comm method;
- ``native_load``: vLLM-Ascend's own ``moe_load`` counters over a record, in logical ids;
- ``expert_loading``: a layout run's expert writes of ``AscendFusedMoE`` journalled, and the load audit after it;
- ``patches``: the model runner's load and step boundary, the worker's control RPC, the API server;
- ``routes``: the recorder routes on vLLM 0.23's API server.
The file format vLLM-Ascend reads (``expert_map_path``) is ``vllm_scene_eplb.formats.vllm_ascend``.
"""

from __future__ import annotations

from .version import SUPPORTED, check_versions

__all__ = ["SUPPORTED", "check_versions", "register"]


def register(ascend_version: str, vllm_version: str) -> None:
    """Install the Ascend wiring (called by ``adapters.entry.register``); refuses other versions."""
    from .startup import register as register_startup

    register_startup(ascend_version, vllm_version)
