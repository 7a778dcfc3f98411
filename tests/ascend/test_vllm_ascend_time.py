"""``time_moe`` on vLLM-Ascend, through its real released code on CPU (``tests/ascend_env``).

Each step runs vLLM-Ascend's real forward context and its unquantized quant method's real ``apply``
(the real ``select_experts``), which hands the routed tokens to the real
``MoECommMethod.fused_experts`` of an ALLTOALL comm method: log2phy, dispatch, ``_apply_mlp``,
combine. Stand-ins: the NPU kernels (the token dispatcher's dispatch and combine, and
``unified_apply_mlp``, a plain-torch matmul), the groups the forward context reads, and
``torch.npu.Event`` (``tests/ascend_standin``: host times, every call logged, a synchronize inside
the forward fails). The plugin's event pairs around ``_apply_mlp`` reach the rank's live answer a
step later and, through the live sample, the status route's ``live.time``.
"""

from __future__ import annotations

import pytest

from ..ascend_env import run

pytestmark = pytest.mark.engine


def test_time_moe_times_the_experts_with_npu_events_and_reaches_live_time(tmp_path):
    """Event pairs around ``_apply_mlp`` in each eager pass (none while a graph is captured), read
    one step later with no synchronize inside the forward; the seconds reach the live answer and
    ``live.time``; FUSED_MC2 is refused."""
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, make_tiny_moe

    spec = TinyMoeSpec()
    out = run("ascend_time_moe", make_tiny_moe(tmp_path / "model", spec), spec.num_experts)
    assert out["after_one"] == [0.0] * spec.num_layers  # read a step later: nothing yet after one pass
    layers = spec.num_layers
    assert out["records"] == 2 * 2 * layers  # two eager passes, a pair per layer; the captured pass none
    live = out["live"]
    assert all(s > 0 for s in live["moe_seconds"]) and live["moe_passes"] == 2, live  # passes 1 and 2 read
    # each step is paired with the pass before's expert seconds (read a step later): both are there
    assert live["steps"] == 2 and live["step_moe_seconds"] > 0 and live["step_seconds"] > 0
    assert out["syncs"] == 2 * layers  # at the step boundaries only (a forward's would have failed)
    assert out["time"] is not None and out["time"]["moe_share"] > 0 and len(out["time"]["rank_ms"][0]) == layers
    assert out["comm_seen"] == {"ALLTOALL": 4}  # the comm-method tally verify.sh's mc2 check reads
    assert "fused MC2" in out["fused"]
