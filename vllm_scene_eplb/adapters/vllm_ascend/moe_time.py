"""``time_moe`` on vLLM-Ascend: this rank's expert computation per MoE layer, timed on the NPU.

``MoECommMethod.fused_experts`` (``ops/fused_moe/moe_comm_method.py``) runs, per MoE layer, the
token dispatch, ``_apply_mlp`` (this rank's experts on the tokens dispatched to it) and the combine.
``install`` wraps ``_apply_mlp`` in a pair of ``torch.npu.Event`` (timing) records on the current
stream: no host wait, so the forward never synchronises. The pair's elapsed time is read a step
later, at the step boundary (``MoeTimer.flush``, between forward passes), where the previous pass's
events have long completed (the wait on its end event is then a formality). The seconds are thus
added to the step after the one they ran in: over a live window of many steps the sums of expert and
step seconds cover the same steps but one at each end.

Passes are timed only where their Python runs per pass, the eager ones: while a graph is captured
(``torch.npu.is_current_stream_capturing``) no event is recorded, and a replayed graph runs no
Python at all. P nodes run eager; on a D node with ACL graphs only its eager passes are timed.
``FUSED_MC2`` (dispatch, expert matmuls and combine in one kernel, its own ``fused_experts``) has no
expert computation apart to time: ``refuse_fused_mc2`` refuses ``time_moe`` there.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from ...errors import SceneEplbError
from .moe_hooks import current_layer

COMM_METHOD_MODULE = "vllm_ascend.ops.fused_moe.moe_comm_method"
TIMER_ATTR = "_scene_eplb_moe_timer"  # on a bound main-model layer: (MoeTimer, its MoE index)


class MoeTimer:
    """The event pairs of the pass being run and of the one before, per MoE layer index."""

    def __init__(self) -> None:
        self._pass: list[tuple[int, Any, Any]] = []  # (moe_idx, start event, end event): torch.npu.Event
        self._previous: list[tuple[int, Any, Any]] = []

    def around(self, moe_idx: int, call: Callable):
        """``call()`` between two recorded timing events (none while a graph is being captured)."""
        import torch

        npu: Any = getattr(torch, "npu")  # noqa: B009 - torch_npu adds it; mypy's torch has no npu
        if npu.is_current_stream_capturing():
            return call()
        start, end = npu.Event(enable_timing=True), npu.Event(enable_timing=True)
        start.record()
        out = call()
        end.record()
        self._pass.append((moe_idx, start, end))
        return out

    def flush(self, add_seconds: Callable[[int, float], None]) -> None:
        """At a step boundary (host): hand the previous pass's expert seconds per layer to
        ``add_seconds(moe_idx, seconds)``, and keep this pass's pairs for the next boundary."""
        for moe_idx, start, end in self._previous:
            end.synchronize()  # between passes: the event completed a pass ago
            add_seconds(moe_idx, start.elapsed_time(end) / 1000.0)
        self._previous, self._pass = self._pass, []


def _wrap_apply_mlp(original: Callable) -> Callable:
    @functools.wraps(original)
    def _apply_mlp(self, *args, **kwargs):
        layer = current_layer.get()
        timed = None if layer is None else layer.__dict__.get(TIMER_ATTR)
        if timed is None:
            return original(self, *args, **kwargs)
        timer, moe_idx = timed
        return timer.around(moe_idx, lambda: original(self, *args, **kwargs))

    _apply_mlp.__scene_eplb_original__ = original  # type: ignore[attr-defined]
    return _apply_mlp


def install() -> None:
    """Wrap ``MoECommMethod._apply_mlp`` (every comm method but FUSED_MC2 runs it); idempotent."""
    cls = importlib.import_module(COMM_METHOD_MODULE).MoECommMethod
    cls._apply_mlp = _wrap_apply_mlp(getattr(cls._apply_mlp, "__scene_eplb_original__", cls._apply_mlp))


def bind(timer: MoeTimer, layers: list) -> None:
    """Time the expert computation of these main-model MoE layers (index = position in ``layers``)."""
    for idx, layer in enumerate(layers):
        layer.__dict__[TIMER_ATTR] = (timer, idx)


def refuse_fused_mc2(ascend_config) -> None:
    """``time_moe`` cannot time FUSED_MC2's single kernel apart from its dispatch and combine."""
    if getattr(ascend_config, "enable_fused_mc2", 0):
        raise SceneEplbError(
            "scene_eplb.time_moe cannot time the experts under vLLM-Ascend's fused MC2 (enable_fused_mc2: "
            "dispatch, expert matmuls and combine are one kernel): turn one of them off"
        )
