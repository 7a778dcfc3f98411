"""A/B results: the scene definition, the metrics, per-run summaries, aggregates and result files.

``read_vllm_result`` reads `vllm bench serve`'s own detailed result (``--save-result
--save-detailed``: per request its TTFT, latency and output length) as the load ``pair-advise`` prices.

Pure (numpy and stdlib): ``compare``, the CLI and the demo read results through this module without
importing vLLM; ``bench`` (which drives vLLM's benchmark) writes them.

Per-card throughput divides by all P + D cards. The steady-state window is the span in which all C
request slots are busy; under 60 s it is flagged as not steady-state. Anything not measured is
NOT_OBSERVED, never estimated. Repeats give a mean and a 95% confidence interval (Student t).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..advise.pair import PairLoad
from ..errors import SceneEplbError
from ..fileio import doc_checksum, load_json
from ..protocol import StatusAnswer
from ..protocol.fields import _Fields, _is_int, _is_number
from .stats import t_quantile

NOT_OBSERVED = "NOT_OBSERVED"
STEADY_MIN_S = 60.0
RESULT_FORMAT = "scene-eplb-bench"
METRICS = (
    "output_throughput_per_card",
    "output_throughput_per_card_steady",
    "prefill_throughput_per_card",
    "prefill_throughput_per_card_steady",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
)  # TPOT: per request, mean time per output token; ITL: between any two tokens
# Higher is better for throughput; lower for latencies.
HIGHER_IS_BETTER = {m: "throughput" in m for m in METRICS}


@dataclass(frozen=True)
class BenchLoad:
    """A named load: request count N, concurrency C, rate r (req/s, inf = all at once), lengths, cache share."""

    name: str
    num_prompts: int
    concurrency: int
    request_rate: float
    input_len: int
    output_len: int
    prefix_share: float = 0.0
    cards: int | None = None  # all P + D cards; None: the server's own ranks (``bench`` resolves it)
    seed: int = 0

    def __post_init__(self) -> None:
        if (
            self.num_prompts < 1
            or self.concurrency < 1
            or self.input_len < 1
            or self.output_len < 1
            or (self.cards is not None and self.cards < 1)
        ):
            raise SceneEplbError("scene: N, C, input/output lengths and cards must be >= 1")
        if not (self.request_rate > 0):
            raise SceneEplbError("scene: request rate must be > 0 (inf = all at once)")
        if not 0.0 <= self.prefix_share < 1.0:
            raise SceneEplbError("scene: prefix share must be in [0, 1)")

    @property
    def prefix_len(self) -> int:
        return int(round(self.input_len * self.prefix_share))


# The prefill throughput an A/B of a prefill scene reads: the steady window's, else the whole run's.
PREFILL_METRICS = ("prefill_throughput_per_card_steady", "prefill_throughput_per_card")


def prefill_metric(docs: list[dict]) -> str:
    """The first of ``PREFILL_METRICS`` that every run of every bench result in ``docs`` observed as a
    positive number (a run with no steady window has none), else the last (whole-run) one, whose
    reader then says which run lacks it."""

    def observed(metric: str) -> bool:
        values = [run.get(metric) for doc in docs for run in doc.get("runs") or [{}]]
        return all(type(v) in (int, float) and math.isfinite(v) and v > 0 for v in values)

    return next((m for m in PREFILL_METRICS[:-1] if observed(m)), PREFILL_METRICS[-1])


def server_geometry(status: StatusAnswer | None) -> dict | None:
    """The server's ranks, DP, TP and EP size from its status route's per-rank list (None without one)."""
    if status is None or not status.ranks:
        return None
    ranks, ep = status.ranks, status.status.ep_size
    dp, tp = 1 + max(r.dp_rank for r in ranks), 1 + max(r.tp_rank for r in ranks)
    return {"ranks": len(ranks), "dp": dp, "tp": tp, "ep": ep, "name": f"DP{dp}-TP{tp}-EP{ep}"}


def _window(result: dict, concurrency: int) -> tuple[float, float] | None:
    """[start, end] of the span in which all ``concurrency`` request slots were busy."""
    starts, lat = result.get("start_times"), result.get("latencies")
    if not starts or not lat:
        return None
    events = sorted([(s, 1) for s in starts] + [(s + d, -1) for s, d in zip(starts, lat)], key=lambda e: (e[0], e[1]))
    level, t_full, spans = 0, None, []
    for t, d in events:
        level += d
        if level >= concurrency and t_full is None:
            t_full = t
        elif level < concurrency and t_full is not None:
            spans.append((t_full, t))
            t_full = None
    if not spans:
        return None
    return spans[0][0], spans[-1][1]


def closed_loop_rate(starts: np.ndarray, latencies: np.ndarray, clients: int) -> float | None:
    """A closed loop's steady completions per second [requests: starts, latencies in s], by Little's
    law over the span in which all ``clients`` were busy: the mean number in flight over it divided by
    the mean latency of the requests that finished in it. Counting completions over that span instead
    reads the ramp (the loop started together, nothing finished for a latency) as lost throughput.
    None without a span or with fewer than two requests finished in it."""
    win = _window({"start_times": list(starts), "latencies": list(latencies)}, clients)
    if win is None or win[1] <= win[0]:
        return None
    ends = starts + latencies
    inside = (ends >= win[0]) & (ends <= win[1])
    if inside.sum() < 2:
        return None
    in_flight = np.clip(np.minimum(ends, win[1]) - np.maximum(starts, win[0]), 0.0, None).sum() / (win[1] - win[0])
    return float(in_flight / latencies[inside].mean())


def summarise(result: dict, scene: BenchLoad) -> dict:
    """Per-card metrics of one vllm bench serve result; NOT_OBSERVED where it gave nothing."""
    if scene.cards is None:
        raise SceneEplbError("scene: the number of cards is not known (pass --cards)")
    dur = result.get("duration")
    out: dict = {
        "completed": result.get("completed", NOT_OBSERVED),
        "failed": result.get("failed", NOT_OBSERVED),
        "duration_s": dur if dur else NOT_OBSERVED,
    }
    if dur:
        out["output_throughput_per_card"] = result["total_output_tokens"] / dur / scene.cards
        out["prefill_throughput_per_card"] = result["total_input_tokens"] / dur / scene.cards
    win = _window(result, min(scene.concurrency, scene.num_prompts))
    if win is None or win[1] <= win[0]:
        out["window_s"] = NOT_OBSERVED
        out["steady_state"] = False
    else:
        a, b = win
        out["window_s"] = b - a
        out["steady_state"] = (b - a) >= STEADY_MIN_S
        starts, ttfts, itls = result["start_times"], result["ttfts"], result["itls"]
        tokens = prefill = 0
        for s, ttft, itl, n_in in zip(starts, ttfts, itls, result["input_lens"]):
            if ttft is None or ttft <= 0:
                continue
            times = s + ttft + np.concatenate([[0.0], np.cumsum(itl or [])])
            tokens += int(((times >= a) & (times <= b)).sum())
            prefill += n_in if a <= s + ttft <= b else 0
        out["output_throughput_per_card_steady"] = tokens / (b - a) / scene.cards
        out["prefill_throughput_per_card_steady"] = prefill / (b - a) / scene.cards
    for m in ("ttft", "tpot", "itl"):
        for p in ("50", "99"):
            v = result.get(f"p{p}_{m}_ms")
            out[f"{m}_p{p}_ms"] = v if isinstance(v, (int, float)) and not math.isnan(v) else NOT_OBSERVED
    for m in METRICS:
        out.setdefault(m, NOT_OBSERVED)
    return out


def aggregate(runs: list[dict]) -> dict:
    """Mean and 95% CI per metric over repeats (a metric missing in any repeat is NOT_OBSERVED)."""
    agg: dict[str, object] = {}
    for m in METRICS:
        vals = [r[m] for r in runs]
        if any(v == NOT_OBSERVED for v in vals):
            agg[m] = {"mean": NOT_OBSERVED, "ci95": NOT_OBSERVED, "n": len(vals)}
            continue
        mean = statistics.fmean(vals)
        ci = t_quantile(0.975, len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else None
        agg[m] = {"mean": mean, "ci95": ci, "n": len(vals)}
    agg["steady_state"] = all(r["steady_state"] for r in runs)
    agg["window_s"] = min((r["window_s"] for r in runs if r["window_s"] != NOT_OBSERVED), default=NOT_OBSERVED)
    agg["failed"] = sum(r["failed"] for r in runs if r["failed"] != NOT_OBSERVED)
    agg["completed"] = sum(r["completed"] for r in runs if r["completed"] != NOT_OBSERVED)
    return agg


def read_result(path: str | Path) -> dict:
    """A bench result file, its checksum verified."""
    path = Path(path)
    doc = load_json(path, "bench result")
    if not isinstance(doc, dict) or doc.get("format") != RESULT_FORMAT:
        raise SceneEplbError(
            f"not a scene-eplb bench result (format {doc.get('format') if isinstance(doc, dict) else None!r})", path
        )
    if doc.get("checksum") != doc_checksum(doc):
        raise SceneEplbError("checksum mismatch: the result was changed or truncated", path)
    for key, kind in (("manifest", dict), ("runs", list), ("aggregate", dict)):
        if not isinstance(doc.get(key), kind):
            raise SceneEplbError(f"bench result has no {key!r} {kind.__name__}", path)
    if not isinstance(doc["manifest"].get("scene"), dict):
        raise SceneEplbError("bench result's manifest has no scene object", path)
    for m in METRICS:
        value = doc["aggregate"].get(m, {})
        ok = isinstance(value, dict) and all(_number_or_unobserved(value.get(k)) for k in ("mean", "ci95"))
        if not ok:
            raise SceneEplbError(
                f"bench result's aggregate {m} must hold a mean and ci95 (numbers, null or {NOT_OBSERVED})", path
            )
    return doc


def _number_or_unobserved(value) -> bool:
    return value is None or value == NOT_OBSERVED or (type(value) in (int, float) and math.isfinite(value))


def read_vllm_result(path: str | Path) -> PairLoad:
    """`vllm bench serve`'s detailed result (``--save-result --save-detailed``) as the pair's load,
    every field it uses checked (one line naming the field): the per-request lists of one length,
    finite and non-negative, a first token no later than the reply's end, as many successful
    requests (no error, an output) as ``completed`` says, ``total_output_tokens`` their sum, the rate
    a number > 0 or "inf", the cap an integer >= 1 or null. A closed loop's throughput is its steady
    rate (``closed_loop_rate``) where its start times give one, else over the run."""
    doc = load_json(path, "bench result")
    if isinstance(doc, dict) and doc.get("format") == RESULT_FORMAT:
        raise SceneEplbError(
            "a scene-eplb bench result holds per-run summaries, not per-request times: give vllm bench serve's "
            "own result (--save-result --save-detailed)",
            path,
        )
    f = _Fields(doc, "vllm bench result", str(path), prefix="")
    for key in ("duration", "completed", "request_rate", "output_lens", "ttfts", "latencies"):
        if key not in f.doc:
            f.fail(f"has no {key!r} (vllm bench serve writes it with --save-detailed)")
    duration, completed = f.number("duration", 0), f.integer("completed", 1)
    rate = f.get("request_rate", lambda v: v == "inf" or _is_number(v, 1e-12), 'a number > 0 or "inf"')
    cap = f.get("max_concurrency", lambda v: _is_int(v, 1), "an integer >= 1", nullable=True, default=None)
    outs = np.array(f.integers("output_lens"), dtype=np.int64)
    n = len(outs)
    lists = {k: np.array(f.numbers(k, 0), dtype=float) for k in ("ttfts", "latencies")}
    starts = f.numbers("start_times") if "start_times" in f.doc else None
    errors = f._list("errors", lambda v: isinstance(v, str), "strings", False, None) if "errors" in f.doc else None
    for key, values in (*lists.items(), ("start_times", starts), ("errors", errors)):
        if values is not None and len(values) != n:
            f.fail(f"{key} holds {len(values)} requests, output_lens {n}")
    if duration <= 0 or n == 0:
        f.fail("has no requests or no duration")
    total = f.integer("total_output_tokens", 0) if "total_output_tokens" in f.doc else None
    if total is not None and total != int(outs.sum()):
        f.fail(f"total_output_tokens {total} is not the sum of output_lens {int(outs.sum())}")
    ok = (outs >= 1) & (np.array([not e for e in errors]) if errors is not None else True)
    if int(ok.sum()) != completed:
        f.fail(f"says completed {completed}, its per-request lists {int(ok.sum())} successful requests")
    ttft, lat = lists["ttfts"][ok], lists["latencies"][ok]
    bad = np.flatnonzero((ttft <= 0) | (ttft > lat))
    if bad.size:
        f.fail(f"request {int(np.flatnonzero(ok)[bad[0]])} has its first token at {ttft[bad[0]]} s of a {lat[bad[0]]} s reply")
    many = outs[ok] >= 2
    if many.sum() < 2 or float((lat - ttft)[many].sum()) <= 0:
        f.fail("has fewer than 2 requests with a decode (output_lens >= 2 and time after the first token)")
    closed = rate == "inf"
    throughput = completed / duration
    clients = n if cap is None else min(cap, n)
    if closed and starts:
        steady = closed_loop_rate(np.array(starts)[ok], lat, clients)
        throughput = throughput if steady is None else steady
    return PairLoad(ttft, lat, outs[ok], throughput, cap, math.inf if closed else float(rate))
