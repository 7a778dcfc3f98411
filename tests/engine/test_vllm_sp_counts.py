"""Sequence-parallel MoE through vLLM 0.33's released Python (``tests/vllm033_env``): where vLLM hands
each TP rank a chunk of the step, every TP rank counts its own chunk's real rows and the sum over the
TP ranks (what the export sums) equals the unsharded counts exactly, step by step.

``tests/scripts/vllm_sp_counts.py`` plays the 4 TP ranks of one DP rank in turn with the plugin bound
to vLLM's real ``MoERunner`` class, over 7 steps whose padded sizes leave graph padding, a one-token
step, a chunk that ends inside the step and ranks whose chunk is all padding. The sharding is vLLM's
real code: DeepSeek-V4's ``DeepseekV4Model.forward`` (``sp_padding_mask``, ``sp_shard`` of hidden
states and input ids, its hash layer routing by the sharded ids) and Qwen3-MoE's
``Qwen3MoeSparseMoeBlock.forward`` (``sequence_parallel_chunk``); the padding mask is the V1 runner's
real ``_prepare_padding_mask`` in a real forward context, with ``VLLM_MOE_SKIP_PADDING`` 1 (V4 then
replaces the context's mask with its chunk's) and 0; the shard decision is vLLM's own on real configs
(``_use_sequence_parallel``, ``ParallelConfig.use_sequence_parallel_moe``), both ways. The stand-ins,
named there: the TP and PP groups, the CUDA top-k kernels (plain torch behind vLLM's router template),
V4's tilelang kernels and its attention (left out of ``V4LayerStandIn``), the modular kernel object.

On the code before this change (TP rank 0 alone counting) the sharded cases count 52 of 132.
"""

from __future__ import annotations

import pytest

from .. import vllm033_env

pytestmark = [pytest.mark.engine, pytest.mark.side_lane]  # no server: scripts/test.sh runs it in its second lane

CASES = [f"{model}_{dp}_skip{skip}" for model in ("v4", "block") for dp in ("dp2", "dp1") for skip in ("1", "0")]


@pytest.fixture(scope="module")
def result() -> dict:
    out = vllm033_env.run("vllm_sp_counts")
    assert out["version"] == "0.33.0"
    return out


def test_v4_shards_at_dp_2_on_a_backend_vllm_does_not_call_sequence_parallel(result):
    """The silent case of the field: V4's own rule shards, ``use_sequence_parallel_moe`` says no."""
    assert result["v4_dp2_skip1"]["sharded"] is True and result["v4_dp1_skip1"]["sharded"] is False
    assert result["use_sequence_parallel_moe"] == {"dp2": False, "dp1": False}
    assert result["block_dp2_skip1"]["sharded"] is True and result["block_dp1_skip1"]["sharded"] is False


@pytest.mark.parametrize("case", CASES)
def test_the_tp_ranks_sum_to_the_unsharded_counts_exactly(result, case):
    """33 real tokens x top-2 x 2 layers = 132, and every step's [L, E] counts equal the unsharded routing's."""
    got = result[case]
    assert got["exact"] is True and got["total"] == got["expected"] == 132
    assert got["tokens"] == result["real_tokens"] == 33  # the scheduled tokens once per DP rank, not once per TP rank
    assert got["skipped"] == 0


@pytest.mark.parametrize("case", [c for c in CASES if "dp2" in c])
def test_sharded_every_tp_rank_counts_its_own_chunk(result, case):
    got = result[case]
    assert got["contributes"] == [True] * 4 and got["sources"] == [[r, 1] for r in range(4)]
    assert all(n > 0 for n in got["per_rank"]) and got["per_rank"][0] < 132


@pytest.mark.parametrize("case", [c for c in CASES if "dp1" in c])
def test_unsharded_tp_rank_0_counts_the_step(result, case):
    got = result[case]
    assert got["contributes"] == [True, False, False, False] and got["per_rank"] == [132, 0, 0, 0]
    assert got["sources"] == [[0, 4]] * 4


def test_a_model_whose_moe_layers_disagree_on_sharding_stops_startup(result):
    assert result["mixed"].startswith("MoE layers [0] route TP chunks of the step")
