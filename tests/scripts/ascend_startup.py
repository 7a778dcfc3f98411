"""vLLM-Ascend's startup with the plugin's config hook: the expert map it reads and every rank's log2phy, ours and theirs (tests/ascend/test_vllm_ascend.py).

Arguments: the model folder, the cases (JSON: name -> {"additional": the additional config, "draft":
true for the config vLLM 0.23's drafter loading builds from the server's
(``SpecDecodeBaseProposer._create_draft_vllm_config``, a ``dataclasses.replace``) instead of the
log2phy maps}), the number of MoE layers and of experts. One process for all of them (vLLM 0.23's
import is most of a case's time). Prints one JSON object: name -> the case's answer, with the lines
the plugin's config hook logged for it under ``log``."""

from __future__ import annotations

import json
import logging
import sys
from types import SimpleNamespace


def draft_config(vc) -> dict:
    """The drafter's config as vLLM 0.23's proposer builds it (its real code on a stand-in proposer
    whose speculative config asks for no kernel overrides), or its refusal."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    spec = SimpleNamespace(method="mtp", moe_backend=None, attention_backend=None)
    try:
        draft = SpecDecodeBaseProposer._create_draft_vllm_config(SimpleNamespace(speculative_config=spec, vllm_config=vc))
    except Exception as exc:
        return {"refused": str(exc)}
    return {"server": vc.additional_config["eplb_config"], "draft": draft.additional_config.get("eplb_config")}


def answer(model: str, extra: dict, n_moe: int, E: int, draft: bool) -> dict:
    """One case: the config's refusal, the drafter's copy (``draft``), or the expert map and log2phy maps."""
    import torch
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm_ascend.ascend_config import EplbConfig
    from vllm_ascend.eplb.core import eplb_utils as eu

    torch.Tensor.npu = lambda self: self  # type: ignore[attr-defined]  # no NPU here: their code moves log2phy to it
    mc = ModelConfig(model=model)
    pc = ParallelConfig(tensor_parallel_size=2, enable_expert_parallel=True)
    try:
        vc = VllmConfig(model_config=mc, parallel_config=pc, additional_config=extra)
    except Exception as exc:
        return {"refused": str(exc)}
    if draft:
        return draft_config(vc)
    if "eplb_config" not in vc.additional_config:  # a collection run: nothing to map
        return {"path": None}
    plain = VllmConfig(model_config=mc, parallel_config=pc, additional_config={})
    ec = EplbConfig(vc.additional_config["eplb_config"])  # their config class accepts what we set
    out = {"path": ec.expert_map_path}
    for name, cfg in (("ours", vc), ("theirs", plain)):
        rows, formula = [], []
        with set_current_vllm_config(cfg):
            for k in range(n_moe):
                for r in range(2):
                    g, _, log2phy, _ = eu.init_eplb_config(ec, k, SimpleNamespace(num_experts=E, ep_size=2, ep_rank=r), tp_size=2)
                    rows.append(log2phy.tolist())
                    formula.append(THEIRS[0](list(g), r, tp_size=2).tolist())
        out[name], out[name + "_formula"] = rows, formula
    return out


class Lines(logging.Handler):
    """The messages logged while a case runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


THEIRS: list = []  # vLLM-Ascend's own generate_log2phy_map, taken before the plugin registers


def main() -> None:
    model, cases, n_moe, E = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    logging.basicConfig(level=logging.INFO)  # a server configures this; a bare script must, to see the config hook's line
    from vllm_ascend.eplb.core import eplb_utils as eu

    THEIRS.append(eu.generate_log2phy_map)
    import vllm_scene_eplb.adapters.entry as entry

    entry.register()  # real vLLM 0.23 and vLLM-Ascend 0.23.0.post1: the Ascend adapter
    hook = logging.getLogger("vllm.scene_eplb")
    out = {}
    for name, case in cases.items():
        lines = Lines()
        hook.addHandler(lines)
        try:
            out[name] = answer(model, case["additional"], n_moe, E, bool(case.get("draft")))
        finally:
            hook.removeHandler(lines)
        out[name]["log"] = "\n".join(lines.lines)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
