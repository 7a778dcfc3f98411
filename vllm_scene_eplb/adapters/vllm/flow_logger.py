"""The node's flow from vLLM 0.32's own per-step stats: a stat logger the routes append to the API
server's ``StatLoggerManager`` (only under the plugin's flag, never as a ``vllm.stat_logger_plugins``
entry point, which would turn vLLM's stats on for servers without the flag). Each ``record`` is one
engine step's ``SchedulerStats`` and ``IterationStats``, read into a ``runtime.server.node_flow.FlowStep``."""

from __future__ import annotations

import logging
import time
from typing import Any

from ...runtime.server.node_flow import FlowStep, NodeFlow

logger = logging.getLogger("vllm.scene_eplb")


def attach_flow(engine_client: Any, window_s: float) -> tuple[NodeFlow | None, str | None]:
    """A ``NodeFlow`` fed by every engine step of ``engine_client`` (vLLM's ``AsyncLLM``), or None and
    why not (vLLM's stats are off: ``--disable-log-stats``)."""
    from vllm.v1.metrics.loggers import AggregateStatLoggerBase

    manager = getattr(engine_client, "logger_manager", None)
    if manager is None:
        return None, "vLLM's stats are off (--disable-log-stats): the node's flow is not measured"
    flow = NodeFlow(max_num_seqs=int(engine_client.vllm_config.scheduler_config.max_num_seqs), window_s=window_s)

    class FlowLogger(AggregateStatLoggerBase):
        """Every engine's steps into ``flow`` (the API server's event loop calls it once per step)."""

        def __init__(self, vllm_config=None, engine_indexes=None):  # built here, not by vLLM's factory
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            """One step into the flow. It runs inside vLLM's output handler, whose loop an exception
            would end: a failure is logged once and the flow stops, the server serves on."""
            if scheduler_stats is None or flow.broken:  # outputs without stats: the step's came in another batch
                return
            try:
                self._record(scheduler_stats, iteration_stats)
            except Exception:  # noqa: BLE001 - never into vLLM's output handler
                flow.broken = "the node's flow stopped: reading vLLM's step stats failed (see the server log)"
                logger.exception("scene-eplb: the node's flow stopped")

        def _record(self, scheduler_stats, iteration_stats) -> None:
            it = iteration_stats
            flow.observe(
                FlowStep(
                    at=time.monotonic(),
                    running=scheduler_stats.num_running_reqs,
                    waiting=scheduler_stats.num_waiting_reqs,
                    kv_fetching=sum((scheduler_stats.num_kv_fetch_reqs_by_stage or {}).values()),
                    prompt_computed=0 if it is None else it.prompt_token_stats.computed,
                    generated=0 if it is None else it.num_generation_tokens,
                    first_token_s=() if it is None else tuple(it.time_to_first_tokens_iter),
                    finished=0 if it is None else len(it.finished_requests),
                )
            )

        def log_engine_initialized(self) -> None:
            pass

    manager.stat_loggers.append(FlowLogger())
    return flow, None
