"""The recorder under vLLM-Ascend's V4-Flash P recipe settings: FlashComm1 (sequence parallelism),
DSA-CP and shared-expert DP, through the released sequence-parallel padding and split code on CPU
(``tests/scripts/ascend_sp_record.py`` names every stand-in).

Each TP rank routes its own chunk of the batch that the runner padded to a multiple of TP (every DP
rank to the largest); the plugin counts that chunk's real rows and the export sums the ranks. For
both MC2 and ALLTOALL, DP x TP 1 x 4, 2 x 2 and 2 x 4 (real token counts no multiple of TP, so the
chunks carry padding rows whose router logits and stale token ids route somewhere) and both a
hash-routed layer (V4's first layers: experts from ``tid2eid`` on the token ids, which vLLM-Ascend
splits over TP itself) and a score-routed one, the counts of all ranks must equal the experts of the
real tokens, one test per setting.
"""

from __future__ import annotations

import pytest

from ..ascend_env import run

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from vllm_scene_eplb.rig.tiny_deepseek_v4 import make_tiny_deepseek_v4

    return run("ascend_sp_record", make_tiny_deepseek_v4(tmp_path_factory.mktemp("ascend-sp") / "model"), timeout=600)


def _check(rows, setting, on):
    mine = [r for r in rows if r["setting"] == setting]
    assert len(mine) == 2 * 3 * 2, mine  # comm methods x geometries x layer kinds
    for row in mine:
        assert row["sp"] == on and row["flash_comm_v1"], row  # vLLM-Ascend's own config and forward context
        assert row["padding_rows"] > 0 and sum(row["want"]) > 0, row
        assert row["skipped"] == 0 and row["got"] == row["want"], row


def test_flashcomm1_counts_each_real_token_once(recorded):
    """``VLLM_ASCEND_ENABLE_FLASHCOMM1=1``: each rank's chunk is the row-parallel reduce-scatter of the padded batch."""
    _check(recorded, "flashcomm1", [True, False, False])


def test_dsa_cp_counts_each_real_token_once(recorded):
    """``enable_dsa_cp`` (on FlashComm1): each rank's chunk is DSA-CP's even split of the padded token stream."""
    _check(recorded, "dsa_cp", [True, True, False])


def test_shared_expert_dp_counts_each_real_token_once(recorded):
    """``enable_shared_expert_dp`` (which turns FlashComm1 on): ``prepare`` gets it and still skips its own split."""
    _check(recorded, "shared_expert_dp", [True, False, True])
