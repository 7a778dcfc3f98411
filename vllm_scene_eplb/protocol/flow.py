"""A node's flow: what it supplies and what it waits for (P supply, D demand), over the last window
of engine steps, as the status answer carries it under ``FLOW_KEY``.

Every field but ``busy_share`` is read from vLLM's own per-step stats (``SchedulerStats`` and
``IterationStats``, as its stat loggers receive them in the API server); ``busy_share`` is the plugin's
step clock over the live window (``time_moe``). ``FLOW_SOURCES`` names each field's source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import _Fields
from .status import _Answer

FLOW_KEY = "flow"

FLOW_SOURCES = {
    "steps": "vLLM SchedulerStats, one per engine step",
    "prefill_completions_per_s": "vLLM IterationStats.time_to_first_tokens_iter (requests whose first token came out)",
    "prefilled_tokens_per_s": "vLLM IterationStats.prompt_token_stats.computed (prompt tokens computed here)",
    "generated_tokens_per_s": "vLLM IterationStats.num_generation_tokens",
    "finished_per_s": "vLLM IterationStats.finished_requests",
    "waiting": "vLLM SchedulerStats.num_waiting_reqs",
    "running": "vLLM SchedulerStats.num_running_reqs",
    "max_num_seqs": "vLLM scheduler_config.max_num_seqs",
    "kv_fetching_mean": "vLLM SchedulerStats.num_kv_fetch_reqs_by_stage (requests waiting on a remote KV pull)",
    "first_token_ms": "vLLM IterationStats.time_to_first_tokens_iter: arrival here to first token (on D: KV handoff and admission)",
    "short_steps_share": "vLLM SchedulerStats: steps with running < max_num_seqs, nothing waiting and no KV pull pending",
    "busy_share": "the plugin's step clock (scene_eplb.time_moe): step wall time over the live window's wall time",
}


@dataclass(frozen=True)
class FlowView(_Answer):
    """One node's flow over its last ``window_s`` seconds of engine steps (``steps`` of them):
    rates per second, queue and batch means (and their values at the last step), the share of steps
    short of work, the mean first-token time of the requests whose first token came out here, and the
    busy share (None: ``time_moe`` off, or no live window yet). ``first_token_ms`` and
    ``short_steps_share`` are None when the window has nothing to average."""

    window_s: float
    steps: int
    prefill_completions_per_s: float
    prefilled_tokens_per_s: float
    generated_tokens_per_s: float
    finished_per_s: float
    waiting_mean: float
    waiting_now: int
    running_mean: float
    running_now: int
    max_num_seqs: int
    kv_fetching_mean: float
    first_token_ms: float | None
    short_steps_share: float | None
    busy_share: float | None

    @property
    def batch_share(self) -> float:
        """D's mean running batch against its maximum."""
        return self.running_mean / self.max_num_seqs

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None, what: str = "flow") -> FlowView:
        f = _Fields(doc, what, source)
        view = cls(
            f.number("window_s", 0),
            f.integer("steps"),
            f.number("prefill_completions_per_s", 0),
            f.number("prefilled_tokens_per_s", 0),
            f.number("generated_tokens_per_s", 0),
            f.number("finished_per_s", 0),
            f.number("waiting_mean", 0),
            f.integer("waiting_now"),
            f.number("running_mean", 0),
            f.integer("running_now"),
            f.integer("max_num_seqs", 1),
            f.number("kv_fetching_mean", 0),
            f.number("first_token_ms", 0, nullable=True),
            f.number("short_steps_share", 0, 1, nullable=True),
            f.number("busy_share", 0, 1, nullable=True),
        )
        if view.running_now > view.max_num_seqs or view.running_mean > view.max_num_seqs:
            f.fail(f"runs more requests than max_num_seqs {view.max_num_seqs}")
        return view
