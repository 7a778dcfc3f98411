"""Model Runner V2 (vLLM 0.33's default) through its released Python (``tests/vllm033_env``), with the
plugin's patches installed: vLLM's own ``step_eplb_after`` decorator, ``EPLBController`` (its
``step`` and ``suppress()``), ``dispatch_cg_and_sync_dp`` and the V2 runner's ``execute_model``
signature drive the observer. The stand-ins, named so: ``RunnerV2StandIn`` (a subclass of the real
V2 runner whose ``execute_model`` keeps the real signature and runs one "forward" of the scheduled
tokens through the real, patched ``BaseRouter._apply_eplb_mapping``, marking the padding rows in
``input_buffers.is_padding`` as the real one does; ``_dummy_run`` and ``sample_tokens`` carry vLLM's
real decorator) and ``DPGroupStandIn`` (the DP peer's side of the one CPU all-reduce).

The flow: a DP dummy step, a ``skip_eplb`` warm-up (under ``suppress()``), a warm-up of real steps
under ``suppress()`` (as the GPU worker runs it), then two real steps: only the two real steps'
tokens are counted, the ring advances on the dummy step and the real ones only, and each real step's
DP vector is what ``dispatch_cg_and_sync_dp`` agreed. The stand-in forward writes -1 on the padding
rows, as 0.33's top-k does under ``VLLM_MOE_SKIP_PADDING=1``: under a layout they stay -1. The real V2
runner's patched ``load_model`` refuses the flag with ``VLLM_MOE_SKIP_PADDING=0``, read by 0.33's ``envs``.
"""

from __future__ import annotations

import pytest

from .. import vllm033_env

pytestmark = [pytest.mark.engine, pytest.mark.side_lane]  # no server: scripts/test.sh runs it in its second lane


@pytest.fixture(scope="module")
def result() -> dict:
    out = vllm033_env.run("vllm_mrv2")
    assert out["version"] == "0.33.0"
    return out


def test_only_real_passes_reach_the_counts(result):
    """Real steps of 10 and 5 tokens x top-2: 30 assignments; the dummy step's rows are padding."""
    g = result["guarded"]
    assert g["live"] == 30 and g["ring"] == 30 and g["passes"] == 2 and g["tokens"] == 15
    assert g["per_entry"] == [0, 20, 10]  # the dummy step advances the ring with nothing counted


def test_the_dp_vector_signs_each_real_step(result):
    assert result["guarded"]["signature"] == [[16, 7], [10, 7], [5, 7]]
    assert result["guarded"]["stamps"] == [0, 1, 2]


def test_without_the_step_start_the_warm_up_leaks_into_the_first_real_step(result):
    """The same flow without the guards (the V2 execute_model patch, the discard on leaving
    ``suppress()``): the skip_eplb warm-up's 128 assignments and the suppressed step's 80 are
    committed by the first real step."""
    u = result["unguarded"]
    assert u["live"] == 30 + 128 + 80 and u["per_entry"] == [0, 20 + 128 + 80, 10]


def test_padding_sentinels_stay_padding_under_a_layout(result):
    """10 real tokens padded to 16, top-2, no padding mask: the padding rows reach the capture as -1
    (not expert 7's replica, where indexing with -1 lands) and only the 20 real assignments count."""
    assert result["sentinels"] == {"padding_slots": [-1], "physical": 20}


def test_the_flag_refuses_model_runner_v2_without_skip_padding(result):
    """With VLLM_MOE_SKIP_PADDING=0 the V2 runner never refreshes ``input_buffers.is_padding`` (graph
    capture leaves it all True): the flag stops startup saying why; with 1, or without the flag, it loads."""
    flag = result["padding_flag"]
    refusal = flag.pop("flag=True skip=0")
    assert "needs VLLM_MOE_SKIP_PADDING=1" in refusal and "input_buffers.is_padding" in refusal
    assert "count nothing" in refusal and "VLLM_USE_V2_MODEL_RUNNER=0" in refusal
    assert set(flag.values()) == {"loads"} and len(flag) == 3
