"""A speculative drafter's MoE layers on vLLM (DeepSeek's MTP layer): found, and which rows of each
drafter pass are real.

vLLM runs a drafter model (a ``SpecDecodeBaseProposer``: MTP, EAGLE, a draft model) inside the
target's step, after the target's forward and before the step boundary, on a batch padded for
graphs and DP. Before each real drafter forward it tells EPLB how many rows are real
(``eplb_state.prepare_forward(draft_model_config, num_tokens)``); its ``dummy_run`` (warm-ups,
graph capture, a DP rank with nothing to draft) tells nothing. ``DraftRows`` stands in that place:
a padding mask the drafter's capture reads, every row padding until a forward's real rows are
told, and the telling handed on to vLLM's own EPLB state where there is one. So the drafter's
counts are its passes' real rows x top-k: no padding rows, no dummy passes.
"""

from __future__ import annotations

import functools
from typing import Any

PLACEABLE = "SpecDecodeBaseProposer"  # the vLLM proposer base class whose forwards tell EPLB their real rows


def drafter_model(model_runner) -> tuple[Any, Any]:
    """(the runner's drafter, its model), each None where the runner has none (no speculative
    config, an n-gram or suffix draft)."""
    drafter = getattr(model_runner, "drafter", None)
    return drafter, getattr(drafter, "model", None)


def placeable(drafter) -> bool:
    """Whether ``drafter`` tells EPLB its real rows before each forward (vLLM's base proposer), so
    its MoE layers can be counted and placed; Model Runner V2's drafters and other proposers cannot."""
    return any(cls.__name__ == PLACEABLE for cls in type(drafter).__mro__) and hasattr(drafter, "set_eplb_state")


class DraftRows:
    """The drafter's padding mask [capacity] (True: padding), all True until vLLM tells a forward's
    real rows; vLLM's own EPLB state (``inner``, or None) hears the same and answers the rest."""

    def __init__(self, capacity: int, device, inner=None):
        import torch

        self._rows = torch.arange(capacity, device=device)
        self.padding = torch.ones(capacity, dtype=torch.bool, device=device)
        self.inner = inner

    def prepare_forward(self, model_config, num_unpadded_tokens: int, ubatch_slices=None) -> None:
        """vLLM's call before a real drafter forward: its first ``num_unpadded_tokens`` rows are real."""
        import torch

        torch.ge(self._rows, int(num_unpadded_tokens), out=self.padding)
        if self.inner is not None:
            self.inner.prepare_forward(model_config, num_unpadded_tokens, ubatch_slices)

    def reset(self) -> None:
        """Every row padding: a forward that tells nothing (a dummy run) counts nothing."""
        self.padding.fill_(True)

    def __getattr__(self, name: str):
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


def hear_rows(drafter, device) -> DraftRows:
    """Stand ``DraftRows`` in the drafter's EPLB state (vLLM's own kept inside it) and make its
    ``dummy_run`` reset the mask first; returns it."""
    buffer = getattr(drafter, "input_ids", None)  # every drafter forward reads a slice of it
    capacity = buffer.shape[0] if buffer is not None else drafter.max_num_tokens
    rows = DraftRows(capacity, device, drafter.eplb_state)
    drafter.eplb_state = rows
    dummy_run = drafter.dummy_run

    @functools.wraps(dummy_run)
    def counted_as_nothing(*args, **kwargs):
        rows.reset()
        return dummy_run(*args, **kwargs)

    drafter.dummy_run = counted_as_nothing
    return rows
