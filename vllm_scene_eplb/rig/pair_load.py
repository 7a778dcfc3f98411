"""A closed-loop load on a P/D pair, as a disaggregating proxy drives it: each of ``concurrency``
clients sends a request's prompt to P (``max_tokens`` 1: P's prefill, its KV handed over), then the
same prompt to D, streamed, for ``output_len`` tokens, then its next request. The result carries what
``vllm bench serve --save-result --save-detailed`` writes (per-request TTFT as the client sees it: P's
answer plus D's first token; D's inter-token latencies; lengths; concurrency), so ``pair-advise`` reads
either. Every prompt is new (random ids), so P computes it and D loads it through the connector."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class PairRequest:
    """One request's timeline (seconds since its start): P answered, D's first token, D's tokens after it."""

    input_len: int
    started: float = 0.0  # perf_counter at its start
    p_done: float = 0.0
    ttft: float = 0.0
    itls: list[float] = field(default_factory=list)
    output_len: int = 0
    latency: float = 0.0  # the whole request, P's answer to D's last chunk


def _post(url: str, body: dict, timeout: float):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def one_request(p_url: str, d_url: str, model: str, prompt: list[int], output_len: int, timeout: float = 300) -> PairRequest:
    """P's prefill, then D's streamed decode of the same prompt; the request's timeline."""
    out = PairRequest(len(prompt))
    start = time.perf_counter()
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "ignore_eos": True}
    with _post(p_url + "/v1/completions", body, timeout) as resp:
        resp.read()
    out.started, out.p_done = start, time.perf_counter() - start
    body = {**body, "max_tokens": output_len, "stream": True}
    last = None
    with _post(d_url + "/v1/completions", body, timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            doc = json.loads(line[5:])
            if "error" in doc:
                raise RuntimeError(f"D answered an error: {doc['error']}")
            if not doc.get("choices"):
                continue  # a chunk without a token (the final usage chunk)
            now = time.perf_counter() - start
            if last is None:
                out.ttft = now
            else:
                out.itls.append(now - last)
            last, out.output_len = now, out.output_len + 1
    out.latency = time.perf_counter() - start
    return out


def run_closed_loop(
    p_url: str,
    d_url: str,
    model: str,
    concurrency: int,
    seconds: float,
    input_len: int,
    output_len: int,
    vocab: int,
    seed: int = 0,
    warmup_s: float = 0.0,
    at_window_end: Callable[[], Any] | None = None,
) -> dict:
    """``concurrency`` clients for ``warmup_s`` + ``seconds`` (a client's request in flight at the end
    is finished and counted); the result in ``vllm bench serve``'s keys plus ``p_times`` (P's answer per
    request) and ``window``: the measured window, the last ``seconds``, which leaves out the ramp (no
    request done yet) and the drain (clients stopping) that the run's own totals hold: its start and end
    (s since the run's start), the output tokens streamed and the requests finished inside it, and
    what ``at_window_end`` returned, called as the window closes with every client still busy (the
    moment to read the nodes' windows of the same ``seconds``)."""
    rng = random.Random(seed)
    lock = threading.Lock()
    done: list[PairRequest] = []
    errors: list[str] = []
    started = time.perf_counter()
    deadline = started + warmup_s + seconds

    def client(k: int) -> None:
        while time.perf_counter() < deadline and not errors:
            with lock:
                prompt = [rng.randrange(3, vocab) for _ in range(input_len)]
            try:
                req = one_request(p_url, d_url, model, prompt, output_len)
            except Exception as exc:  # noqa: BLE001 - one failed request ends the run with its reason
                errors.append(f"client {k}: {exc}")
                return
            with lock:
                done.append(req)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, deadline - time.perf_counter()))
    seen = at_window_end() if at_window_end is not None and not errors else None
    for t in threads:
        t.join()
    duration = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"the pair load failed: {errors[0]}")
    total_out = sum(r.output_len for r in done)
    a, b = warmup_s, warmup_s + seconds
    return {
        "duration": duration,
        "completed": len(done),
        "max_concurrency": concurrency,
        "request_rate": "inf",
        "total_input_tokens": sum(r.input_len for r in done),
        "total_output_tokens": total_out,
        "output_throughput": total_out / duration,
        "input_lens": [r.input_len for r in done],
        "output_lens": [r.output_len for r in done],
        "ttfts": [r.ttft for r in done],
        "latencies": [r.latency for r in done],
        "start_times": [r.started - started for r in done],
        "itls": [r.itls for r in done],
        "p_times": [r.p_done for r in done],
        "window": {
            "start_s": a,
            "end_s": b,
            "output_tokens": sum(int(((t >= a) & (t <= b)).sum()) for t in (token_times(r, started) for r in done)),
            "finished": sum(1 for r in done if a <= r.started - started + r.latency <= b),
            "at_end": seen,
        },
    }


def token_times(req: PairRequest, origin: float) -> np.ndarray:
    """When each of a request's output tokens arrived [output_len], in seconds since ``origin``."""
    if req.output_len == 0:
        return np.zeros(0)
    return req.started - origin + req.ttft + np.concatenate([[0.0], np.cumsum(req.itls)])
