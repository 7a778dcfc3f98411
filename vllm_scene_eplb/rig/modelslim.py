"""A float checkpoint as a ModelSlim-style W8A8_DYNAMIC one: the format vLLM-Ascend serves with
``--quantization ascend``, for the generated DeepSeek-V3 (``tiny_deepseek``) and DeepSeek-V4
(``tiny_deepseek_v4``) alike. Which tensors are quantised is the model's to say (a predicate on the
checkpoint's own tensor names: the routed experts of its main-model MoE layers); the format is this
module's:

- each quantised projection [out, in] becomes an int8 ``weight`` with a float32 ``weight_scale`` and
  ``weight_offset`` [out, 1] beside it (symmetric per output channel: scale = max |w| / 127, offset
  0), as vLLM-Ascend's ``AscendW8A8DynamicFusedMoEMethod`` loads them;
- every other tensor is kept as it is;
- ``quant_model_description.json`` names every tensor of the checkpoint, by the checkpoint's names,
  ``W8A8_DYNAMIC`` or ``FLOAT`` (vLLM-Ascend's ModelSlim config maps DeepSeek-V4's own names onto its
  modules itself, once it sees V4's ``hc_head_fn`` among them).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

W8A8_DYNAMIC = "W8A8_DYNAMIC"


def w8a8_weights(sd: dict, quantized: Callable[[str], bool]) -> tuple[dict, dict]:
    """(state dict, quant description) of W8A8_DYNAMIC on ``sd``, quantising the tensors ``quantized`` names."""
    import torch

    out: dict = {}
    description: dict = {"model_quant_type": W8A8_DYNAMIC}
    for name, t in sd.items():
        if not quantized(name):
            out[name] = t
            description[name] = "FLOAT"
            continue
        w = t.to(torch.float32)
        scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-12)
        stem = name[: -len("weight")]
        out[name] = torch.round(w / scale).clamp(-127, 127).to(torch.int8).contiguous()
        out[stem + "weight_scale"] = scale.contiguous()
        out[stem + "weight_offset"] = torch.zeros_like(scale)
        for key in (name, stem + "weight_scale", stem + "weight_offset"):
            description[key] = W8A8_DYNAMIC
    return out, description


def write_w8a8(float_dir: str | Path, out_dir: str | Path, quantized: Callable[[str], bool]) -> Path:
    """The float checkpoint in ``float_dir`` as a W8A8_DYNAMIC one in ``out_dir``: its weights
    (``w8a8_weights``), ``quant_model_description.json`` and the float checkpoint's config and
    tokenizer; returns the folder."""
    from safetensors.torch import load_file, save_file

    src, out = Path(float_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sd, description = w8a8_weights(load_file(str(src / "model.safetensors")), quantized)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "quant_model_description.json").write_text(json.dumps(description, indent=1))
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copyfile(f, out / f.name)
    return out
