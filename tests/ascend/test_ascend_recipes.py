"""Every Ascend recipe's configuration through the released engine code's own checks.

Each server command of ``deploy/ascend-910c`` (dry run) gives its ``--kv-transfer-config``,
``--additional-config`` and parallel sizes; a process with real vLLM 0.23 and vLLM-Ascend 0.23.0.post1
(``tests/ascend_env.py``) then feeds them to:

- vLLM's ``KVTransferConfig`` and its connector factory with vLLM-Ascend's connectors registered;
- the ``MooncakeConnectorV1`` worker's own ``_get_prefill_decode_size`` (it asserts that ``prefill``
  and ``decode`` each carry ``tp_size`` and ``dp_size``), with the worker's ``prefill_tp >= decode_tp``
  check; the module is imported for real, with a stand-in ``mooncake.engine`` (tests/ascend_standin);
- a real ``VllmConfig`` on vLLM-Ascend's platform: ``AscendConfig`` reads the additional config,
  ``check_kv_extra_config`` compares each side's sizes with the server's, and this plugin's config
  hook reads ``scene_eplb`` (a layout run writes vLLM-Ascend's expert map).

The old recipes' KV JSON (no ``kv_connector_extra_config``) must fail the connector's check, and a
side whose sizes differ from its server must fail the platform's: the checks can fail.
The model is the tests' generated one (8 experts), so layouts are fitted for it at EP16.

The V4-Flash recipes' whole command lines, at both field scenes (16K cold; 128K warm: 131,076-token
prompts, 90.62% of them a shared prefix), also go through vLLM's own ``api_server`` argument parser and
``create_engine_config`` on vLLM-Ascend's platform, on a tiny V4 W8A8 (ModelSlim's description, which
``--quantization ascend`` requires) with V4-Flash's context (1,048,576 positions); each scene's request
(P: the prompt and one token; D: the prompt and its output) through vLLM's own length checks. The old
lengths (P 131,072, D 65,536) must fail them.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ..ascend_env import env as ascend_env
from ..conftest import run_script
from ..repository.test_deploy import _env as deploy_env
from ..repository.test_deploy import v4_w8a8_model

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "ascend-910c"


def _command(script: str, *args: str, **env_extra: str) -> dict:
    """The recipe's server command (dry run) as the JSON and sizes the engine reads."""
    res = subprocess.run(
        ["bash", str(DEPLOY / script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=deploy_env(**env_extra),
    )
    assert res.returncode == 0, res.stderr
    words = shlex.split(res.stdout)[1:]  # after the HCCL_BUFFSIZE the preflight set
    start = next(i for i, w in enumerate(words) if "=" not in w)
    env = dict(w.split("=", 1) for w in words[:start])  # the environment the recipe exports (FlashComm1)
    argv = words[start:]

    def flag(name):
        return argv[argv.index(name) + 1] if name in argv else None

    return {
        "kv": json.loads(flag("--kv-transfer-config")),
        "extra": json.loads(flag("--additional-config") or "{}"),
        "dp": int(flag("--data-parallel-size")),
        "tp": int(flag("--tensor-parallel-size")),
        "argv": argv[argv.index("vllm.entrypoints.openai.api_server") + 1 :],
        **({"env": env} if env else {}),
    }


def _v4(script: str, recipe: str, mode: str, tiny_v4: Path, **env_extra: str) -> dict:
    """A V4-Flash recipe's command: its dry run sized by the preflight on V4-Flash W8A8's config, checked on a tiny V4."""
    command = _command(script, mode, RECIPE=recipe, MODEL=v4_w8a8_model(), **env_extra)
    return {**{k: v for k, v in command.items() if k != "argv"}, "model": str(tiny_v4)}


# the field's two P scenes: (IN_LEN, OUT_LEN, PREFIX_SHARE)
SCENES = {"16K cold": ("16384", "1024", "0"), "128K warm": ("131076", "1024", "0.9062")}


def _scene(script: str, recipe: str, scene: str, model: Path, **env_extra: str) -> dict:
    """A V4-Flash recipe's whole command line at a field scene, its --model the long-context tiny V4 W8A8,
    with the scene's request: P the prompt and one token, D the prompt and its output."""
    in_len, out_len, share = SCENES[scene]
    env = {"IN_LEN": in_len, "OUT_LEN": out_len, "PREFIX_SHARE": share, **env_extra}
    command = _command(script, "collect", RECIPE=recipe, MODEL=v4_w8a8_model(), **env)
    argv = command["argv"]
    argv[argv.index("--model") + 1] = str(model)
    max_tokens = 1 if script == "p_server.sh" else int(out_len)
    return {**command, "model": str(model), "scene": {"prompt": int(in_len), "max_tokens": max_tokens}}


def _long_context_w8a8(root: Path) -> Path:
    """The tiny V4's ModelSlim W8A8 copy with V4-Flash's context: 65,536 positions before YaRN's x16."""
    from vllm_scene_eplb.rig.modelslim import write_w8a8
    from vllm_scene_eplb.rig.tiny_deepseek_v4 import TinyDeepseekV4Spec, make_tiny_deepseek_v4

    spec = TinyDeepseekV4Spec()
    model = write_w8a8(make_tiny_deepseek_v4(root / "tiny-v4-long"), root / "tiny-v4-long-w8a8", spec.routed_expert_weight)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 1048576
    config["rope_scaling"]["original_max_position_embeddings"] = 65536
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """Every recipe (and two that must fail) through the released code, in one process."""
    from vllm_scene_eplb.rig.tiny_deepseek_v4 import make_tiny_deepseek_v4
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec

    from ..conftest import tiny_model_and_layout

    root = tmp_path_factory.mktemp("recipes")
    spec = TinyMoeSpec(num_heads=8, num_kv_heads=4)  # heads that the recipes' TP8 and TP4 divide
    model, _, layout = tiny_model_and_layout(root, entries=3, num_redundant=8, ep_size=16, spec=spec)
    # the plugin-off layout run reads the expert map the recipe converts before starting
    subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_scene_eplb.cli",
            "convert",
            str(layout),
            "--to",
            "vllm-ascend",
            "-o",
            str(root / "layout.expert_map.json"),
            "-q",
        ],
        check=True,
    )
    base = {"SCENE_EPLB_DIR": str(root / "se")}
    two = {"D_NODES": "2", "D_HEAD_IP": "127.0.0.1"}
    recipes = {
        "p collect": _command("p_server.sh", "collect", **base),
        "p layout static": _command("p_server.sh", "layout", str(layout), **base),
        "p layout dynamic": _command("p_server.sh", "layout", str(layout), DISPATCH="dynamic", **base),
        "p layout, plugin off": _command("p_server.sh", "layout", str(layout), SCENE_EPLB_PLUGIN="0", **base),
        "p plain": _command("p_server.sh", "plain", **base),
        # verify.sh's knobs: vLLM-Ascend's counters on (the recipe exports DYNAMIC_EPLB, their config asserts it), MC2 prefill
        "p collect, native EPLB, MC2 prefill": {
            **_command("p_server.sh", "collect", NATIVE_EPLB="1", PREFILL_MC2="1", CHUNK="2048", **base),
            "env": {"DYNAMIC_EPLB": "true"},
        },
        "p plain, native EPLB": {**_command("p_server.sh", "plain", NATIVE_EPLB="1", **base), "env": {"DYNAMIC_EPLB": "true"}},
        "d collect": _command("d_server.sh", "collect", **base),
        "d layout": _command("d_server.sh", "layout", str(layout), **base),
        "d plain": _command("d_server.sh", "plain", **base),
        # D on two nodes (DP32 x TP1, MTP1): its head node's command, and P's connector naming D's sizes
        "d collect, two nodes": _command("d_server.sh", "collect", NODE_RANK="0", **two, **base),
        "p collect, D on two nodes": _command("p_server.sh", "collect", **two, **base),
    }
    tiny_v4 = make_tiny_deepseek_v4(root / "tiny-v4")
    for recipe in ("v4-flash-field", "v4-flash-tutorial"):
        for mode in ("collect", "plain"):
            recipes[f"p {mode}, {recipe}"] = _v4("p_server.sh", recipe, mode, tiny_v4, **base)
    for mode in ("collect", "plain"):
        recipes[f"d {mode}, v4-flash"] = _v4("d_server.sh", "v4-flash-tutorial", mode, tiny_v4, **base)
    long = _long_context_w8a8(root)
    for scene in SCENES:
        for script, side in (("p_server.sh", "p"), ("d_server.sh", "d")):
            for recipe in ("v4-flash-field", "v4-flash-tutorial"):
                recipes[f"{side} {recipe}, {scene}"] = _scene(script, recipe, scene, long, **base)
    # the old lengths (P 131,072, D 65,536) on the same command lines: vLLM's own checks refuse the scene's requests
    for side, old_len in (("p", "131072"), ("d", "65536")):
        old_line = json.loads(json.dumps(recipes[f"{side} v4-flash-field, 128K warm"]))
        old_line["argv"][old_line["argv"].index("--max-model-len") + 1] = old_len
        recipes[f"{side} v4-flash-field, 128K warm, old length"] = old_line
    # the tutorial D's line without --async-scheduling: vLLM 0.23 schedules async with an MTP drafter anyway
    sync = json.loads(json.dumps(recipes["d v4-flash-tutorial, 16K cold"]))
    sync["argv"].remove("--async-scheduling")
    recipes["d v4-flash-tutorial, 16K cold, no --async-scheduling"] = sync
    # D's recompute key on a P side: vLLM-Ascend's platform reads it and drops it on a kv_producer
    p_recompute = json.loads(json.dumps(recipes["p collect, v4-flash-tutorial"]))
    p_recompute["extra"]["recompute_scheduler_enable"] = True
    recipes["p collect, v4-flash-tutorial, D's recompute key"] = p_recompute
    for name in [n for n in recipes if "argv" in recipes[n] and "scene" not in recipes[n]]:
        del recipes[name]["argv"]  # the generated Qwen3-MoE has no ModelSlim copy: its flags are checked, not its whole line
    old = dict(recipes["p collect"], kv={k: v for k, v in recipes["p collect"]["kv"].items() if k != "kv_connector_extra_config"})
    wrong = json.loads(json.dumps(recipes["d plain"]))
    wrong["kv"]["kv_connector_extra_config"]["decode"]["dp_size"] = 8
    cases = {**recipes, "old json (no extra config)": old, "decode side sized 8, server 4": wrong}
    res = run_script("ascend_recipes_check", json.dumps(cases), model, env=ascend_env(), timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return recipes, json.loads(res.stdout.strip().splitlines()[-1]), res.stdout + res.stderr, root


def test_every_recipe_passes_the_released_engine_checks(checked):
    recipes, out, log, root = checked
    for name in recipes:
        assert out[name]["ok"], f"{name}: {out[name]['error']}"
        assert out[name]["connector"] == "MooncakeConnector"
        assert out[name]["connector_module"] == ("mooncake_hybrid_connector" if "v4-flash" in name else "mooncake_connector")
    assert {out[n]["kv_role"] for n in recipes if n.startswith("p ")} == {"kv_producer"}
    assert {out[n]["kv_role"] for n in recipes if n.startswith("d ")} == {"kv_consumer"}
    assert min(out[n]["kv_port"] for n in recipes) >= 36000  # clear of Mooncake's transfer ports on a 16-NPU node
    assert recipes["d collect, two nodes"]["dp"] == 32 and recipes["d collect, two nodes"]["tp"] == 1
    # the plugin's layout run points vLLM-Ascend at the map it wrote; plugin off, at the converted one
    assert out["p layout static"]["expert_map_path"].startswith(str(root / "se" / "dumps"))
    assert out["p layout, plugin off"]["expert_map_path"] == str(root / "layout.expert_map.json")
    assert "scene-eplb: collection run (role prefill" in log and "scene-eplb: collection run (role decode" in log
    knobs = out["p collect, native EPLB, MC2 prefill"]
    assert knobs["dynamic_eplb"] and knobs["prefill_mc2"] and not out["p collect"]["dynamic_eplb"]


def test_the_old_json_and_a_mismatched_side_fail_the_same_checks(checked):
    _, out, _, _ = checked
    assert not out["old json (no extra config)"]["ok"] and out["old json (no extra config)"]["error"].startswith("AssertionError")
    bad = out["decode side sized 8, server 4"]
    assert not bad["ok"] and "conflicting data parallel size" in bad["error"]


def test_the_v4_flash_recipes_follow_the_field_and_the_tutorial(checked):
    """P after the field (DP16 x TP1 = EP16, one request at a time, chunk 8192) and after vLLM-Ascend's
    V4-Flash tutorial (DP4 x TP4 eager with FlashComm1, shared-expert DP and DSA-CP, which its real
    config turns on), D after the tutorial (DP16 x TP1, FULL_DECODE_ONLY, MTP 1), all through
    MooncakeHybridConnector's own worker check, handshake ports at or above 36000."""
    recipes, out, _, _ = checked
    field, tutorial, d = (
        recipes["p collect, v4-flash-field"],
        recipes["p collect, v4-flash-tutorial"],
        recipes["d collect, v4-flash"],
    )
    assert (field["dp"], field["tp"], tutorial["dp"], tutorial["tp"], d["dp"], d["tp"]) == (16, 1, 4, 4, 16, 1)
    assert out["p collect, v4-flash-field"]["sp"] == [False, False, False]
    assert out["p collect, v4-flash-tutorial"]["sp"] == [True, True, True]  # FlashComm1, DSA-CP, shared-expert DP
    timeouts = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "30000", "HCCL_EXEC_TIMEOUT": "204"}
    assert tutorial["env"] == {"VLLM_ASCEND_ENABLE_FLASHCOMM1": "1", **timeouts} and field["env"] == d["env"] == timeouts
    assert out["d collect, v4-flash"]["sp"] == [False, False, False]
    assert {out[n]["kv_port"] for n in recipes if "v4-flash" in n} == {36000, 36100}


def test_the_v4_flash_d_runs_the_tutorials_scheduler_drafter_and_timeouts(checked):
    """The tutorial D's flags as the released engines take them, on both field scenes: vLLM-Ascend's
    AscendConfig reads recompute_scheduler_enable and multistream_overlap_shared_expert beside the
    plugin's keys, its platform swaps in its async recompute scheduler (--async-scheduling with the MTP
    drafter passes vLLM 0.23's check), the drafter is MTP 1 eager, and vLLM's executor reads the
    tutorial's 30000 s a model step (its VLLM_RPC_TIMEOUT no released engine reads: left out). Without
    --async-scheduling vLLM schedules async all the same (verify.sh's totals bound assumes it); on a P
    side the recompute key is dropped."""
    recipes, out, _, _ = checked
    for scene in SCENES:
        d, field = out[f"d v4-flash-tutorial, {scene}"], out[f"d v4-flash-field, {scene}"]
        assert (d["recompute_scheduler"], d["shared_expert_overlap"], d["async_scheduling"]) == (True, True, True), d
        assert d["scheduler_cls"] == field["scheduler_cls"] == "AsyncRecomputeScheduler" and d["speculative"] == ["mtp", 1, True]
        assert d["execute_model_timeout"] == 30000 and d["reads_rpc_timeout"] is False
        p = out[f"p v4-flash-tutorial, {scene}"]
        assert p["execute_model_timeout"] == 30000 and not p["recompute_scheduler"] and p["scheduler_cls"] != d["scheduler_cls"]
    assert out["d v4-flash-tutorial, 16K cold, no --async-scheduling"]["async_scheduling"] is True
    assert out["p collect, v4-flash-tutorial, D's recompute key"]["recompute_scheduler"] is False
    assert out["d collect, v4-flash"]["recompute_scheduler"] is True and out["d collect"]["recompute_scheduler"] is False


@pytest.mark.parametrize("scene", SCENES)
def test_the_field_scenes_dry_run_through_vllms_own_argument_and_length_checks(checked, scene):
    """Both V4-Flash recipes at the field's scenes: vLLM's parser and engine config take each whole command
    line (ModelSlim's --quantization ascend on a W8A8 copy), P's --max-model-len takes the prompt and one
    token and D's the prompt and its output (vLLM's own request checks pass), prefix caching on exactly
    where the scene shares a prefix; the preflight passed every side (the dry run ran it on a 64 GiB die)."""
    recipes, out, _, _ = checked
    in_len, out_len, share = (int(SCENES[scene][0]), int(SCENES[scene][1]), float(SCENES[scene][2]))
    for side in ("p", "d"):
        for recipe in ("v4-flash-field", "v4-flash-tutorial"):
            got = out[f"{side} {recipe}, {scene}"]
            assert got["ok"] and got["scene_refused"] is None, got
            assert got["max_model_len"] == in_len + (1 if side == "p" else out_len)
            assert got["prefix_caching"] is (share > 0) and got["quantization"] == "ascend" and got["block_size"] == 128


def test_the_old_lengths_fail_vllms_own_length_checks(checked):
    """P at 131,072 and D at 65,536 (the recipes before the scene sized them) refuse the 128K scene's requests."""
    _, out, _, _ = checked
    p, d = out["p v4-flash-field, 128K warm, old length"], out["d v4-flash-field, 128K warm, old length"]
    assert p["ok"] and "maximum context length is 131072 tokens" in p["scene_refused"], p
    assert d["ok"] and "maximum context length is 65536 tokens" in d["scene_refused"], d


def _page(spec: bool, local: int, gen: int, done: int, drafts: int, accepted: int) -> str:
    """A /metrics page with the counters ``engine_tokens`` reads (the spec-decode ones where a drafter runs)."""
    text = (
        f'vllm:prompt_tokens_total{{engine="0"}} {local}\n'
        f'vllm:generation_tokens_total{{engine="0"}} {gen}\n'
        f'vllm:request_success_total{{engine="0",finished_reason="length"}} {done}\n'
        'vllm:num_preemptions_total{engine="0"} 0\n'
    )
    if spec:
        text += f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {drafts}\n'
        text += f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}\n'
    return text


def test_verify_totals_bound_holds_on_the_released_schedulers(checked):
    """``verify.sh``'s totals with the MTP drafter on, against what the released schedulers schedule
    (tests/scripts/ascend_spec_counters.py: vLLM 0.23's and vLLM-Ascend's own, sync and async, K = 0-3,
    on the tutorial D's engine config): the tokens scheduled (what the target's MoE layers run) lie
    within ``engine_tokens``' floor and ceiling read from the counters the engine exports, exactly the
    floor without a drafter; no request runs more than 2K tokens above its share of the floor (K
    synchronously). The ceiling is needed: drafts cut past max_tokens lift sync runs above the floor,
    and async runs a request more than K above it (a pass of a request that had finished)."""
    from vllm_scene_eplb.ab.engine_tokens import engine_tokens

    recipes, *_ = checked
    argv = list(recipes["d v4-flash-tutorial, 16K cold"]["argv"])
    for flag in ("--kv-transfer-config", "--additional-config"):  # no P to pull from: local prefill
        del argv[argv.index(flag) : argv.index(flag) + 2]
    res = run_script("ascend_spec_counters", json.dumps(argv), env=ascend_env(), timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    cases = json.loads(res.stdout.strip().splitlines()[-1])
    most = {"sync": 0, "async": 0}
    for name, c in cases.items():
        k, mode = int(name.split(" K")[1].split()[0]), "async" if name.startswith("Async") else "sync"
        assert c["finished"] == c["by_length"] == c["requests"] == 48, (name, c)
        after = _page(k > 0, c["prompt"], c["generated"], c["finished"], c["drafts"], c["accepted"])
        engine = engine_tokens(_page(k > 0, 0, 0, 0, 0, 0), after, decode=True, local_prompt=False, spec_tokens=k)
        assert engine.floor <= c["scheduled"] <= engine.floor + engine.slack, (name, c, engine)
        assert engine.slack == 2 * k * 48 and (k or c["scheduled"] == engine.floor)
        low, high = c["request_excess"]
        assert 0 <= low <= high <= (2 if mode == "async" else 1) * k, (name, c)
        most[mode] = max(most[mode], high / max(k, 1))
    assert 0 < most["sync"] <= 1 < most["async"] <= 2, most
