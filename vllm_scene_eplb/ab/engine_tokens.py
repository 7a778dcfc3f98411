"""The tokens an engine ran through its MoE layers over a window, from two of its /metrics pages.

A prefill side runs its prompt tokens (``vllm:prompt_tokens_total``; a D node that pulled its
prompts' KV only ``prompt_tokens_by_source{source="local_compute"}``). A decode load adds one token
per decode pass: generated tokens minus finished requests (each request's first token comes out of
its prefill pass). With a drafter (``spec_tokens`` K > 0) a pass verifies the drafts scheduled
beside its token: it runs 1 + d tokens and outputs 1 + a, so the passes run
``generated - requests - accepted + drafts`` tokens, each term an engine counter
(``vllm:spec_decode_num_draft_tokens_total`` and ``..._accepted_tokens_total``, vLLM 0.23's, which
vLLM-Ascend 0.23.0.post1 exports unchanged; its recompute scheduler's placeholder drafts beside a
pulled request's last prompt token are scheduled drafts like any other and counted there).

That count is exact without a drafter and a floor with one: vLLM 0.23 counts what it outputs, and

- a request's last pass may accept drafts past ``max_tokens``; they are cut from the output
  (``check_stop``) but were run: at most K tokens a request;
- async scheduling (vLLM 0.23's default with an MTP drafter) schedules a request's next pass
  before its previous pass's output is known, and skips it only when that output surely reaches
  ``max_tokens`` (``num_computed_tokens + 2 - num_output_placeholders``); when the previous pass's
  accepted drafts finish the request, the next pass (1 + K tokens) ran for a finished request and
  nothing counts it. Its previous pass then cut at most K - 1 tokens.

So a request runs at most 2K tokens the counters do not see, and the ceiling is the floor plus
2K x requests. Both hold only for the load's requests alone: each finished by length (the load
ignores EOS), none preempted (a preempted request recomputes tokens no counter adds, and
vLLM-Ascend's recompute scheduler hands a request D has no KV room for back to the proxy, finished
by "stop"): otherwise the window is refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import SceneEplbError

PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
FINISHED_REQUESTS = "vllm:request_success_total"
BY_LENGTH = 'finished_reason="length"'
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_BY_SOURCE, LOCAL_COMPUTE = "vllm:prompt_tokens_by_source_total", 'source="local_compute"'
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"


def series(metrics_text: str, name: str) -> list[tuple[str, float]]:
    """Every sample of ``name`` on a /metrics page (Prometheus text): its labels as written and its value."""
    sample = re.compile(r"^" + re.escape(name) + r"(?:\{([^}]*)\})?\s+([0-9.eE+-]+)\s*$", re.M)
    return [(labels, float(v)) for labels, v in sample.findall(metrics_text)]


def counter(metrics_text: str, name: str, label: str = "") -> int:
    """Counter ``name`` summed over every series (one per DP engine, per label) of a /metrics page;
    with ``label`` (``key="value"``) only the series that carry it."""
    values = [v for labels, v in series(metrics_text, name) if not label or label in labels.split(",")]
    if not values:
        raise SceneEplbError(f"no {name}{'{' + label + '}' if label else ''} on this /metrics page")
    return int(round(sum(values)))


@dataclass(frozen=True)
class EngineTokens:
    """The tokens the engine ran over the window: at least ``floor``, at most ``floor + slack``;
    ``rejected`` the drafts it verified and rejected; ``what`` says how they were counted."""

    floor: int
    slack: int
    rejected: int
    what: str


def engine_tokens(before: str, after: str, decode: bool, local_prompt: bool, spec_tokens: int) -> EngineTokens:
    """The engine's tokens between the /metrics pages ``before`` and ``after`` (see the module docstring);
    a window the counters cannot account for is refused (SceneEplbError) with the reason."""

    def delta(name: str, label: str = "") -> int:
        return counter(after, name, label) - counter(before, name, label)

    prompt = delta(PROMPT_BY_SOURCE, LOCAL_COMPUTE) if local_prompt else delta(PROMPT_TOKENS)
    kind = "locally computed prompt" if local_prompt else "prompt"
    drafting = bool(series(after, DRAFT_TOKENS))
    if spec_tokens > 0 and not drafting:
        raise SceneEplbError(
            f"no {DRAFT_TOKENS} on the /metrics page: the engine runs no drafter, yet {spec_tokens} speculative tokens were given"
        )
    drafts, accepted = (delta(DRAFT_TOKENS), delta(ACCEPTED_TOKENS)) if drafting else (0, 0)
    if spec_tokens == 0 and drafts:
        raise SceneEplbError(f"the engine verified {drafts} draft tokens: give its speculative tokens (--spec-tokens)")
    if not decode:
        return EngineTokens(prompt, 0, 0, f"{prompt} {kind} tokens")
    generated, requests = delta(GENERATION_TOKENS), delta(FINISHED_REQUESTS)
    other, preempted = requests - delta(FINISHED_REQUESTS, BY_LENGTH), delta(PREEMPTIONS)
    if other or preempted:
        raise SceneEplbError(
            f"{other} requests finished otherwise than by length and {preempted} were preempted while recording: "
            "tokens they ran count nowhere (a D short of KV room; rerun with fewer D_SEQS_PER_RANK)"
        )
    if spec_tokens == 0:
        floor = prompt + generated - requests
        return EngineTokens(floor, 0, 0, f"({prompt} {kind} + {generated} generated - {requests} requests) tokens")
    floor = prompt + generated - requests - accepted + drafts
    what = (
        f"({prompt} {kind} + {generated} generated - {requests} requests - {accepted} accepted + {drafts} drafts) tokens "
        f"+ up to {2 * spec_tokens} a request the counters cannot see (MTP {spec_tokens}: drafts cut past max_tokens, "
        "one async pass of a finished request)"
    )
    return EngineTokens(floor, 2 * spec_tokens * requests, drafts - accepted, what)
