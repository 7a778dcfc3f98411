"""A model read once from ``--model DIR`` (``read_model``): its config.json as the text model's
config, the quantisation it names (``quantization_config``, or vLLM-Ascend's ModelSlim description
beside it), its MoE geometry and, where a command prices attention, its attention shape. Every
command that takes ``--model`` reads the model here, once, and hands the ``ModelFiles`` on."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import SceneEplbError
from ..fileio import load_json
from .model_geometry import ConfigFields, MlaShape, ModelGeometry, V4Shape, attention_shape, from_hf_config, text_config

MODELSLIM_FILE = "quant_model_description.json"  # vLLM-Ascend's ModelSlim quantisation description
CONFIG_FILE = "config.json"


def model_folder(path: str | os.PathLike) -> Path:
    """The folder of ``--model``: DIR itself, or the folder of DIR/config.json (the model's files)."""
    path = Path(path)
    return path if path.is_dir() else path.parent


@dataclass(frozen=True)
class ModelFiles:
    """A model folder's files as read once: ``cfg`` the text model's config (``text_config`` for a
    multimodal model) with the top-level ``quantization_config``, ``modelslim`` the ModelSlim
    description (or None), ``geometry`` the MoE geometry, all checked."""

    config_path: Path
    cfg: dict
    modelslim: dict | None
    geometry: ModelGeometry

    @property
    def folder(self) -> Path:
        """The folder the model's files are in (its checkpoint, tokenizer and ModelSlim description)."""
        return self.config_path.parent

    @property
    def where(self) -> str:
        """The config file, as errors name it."""
        return str(self.config_path)

    def fields(self) -> ConfigFields:
        """Typed reads of ``cfg``, errors naming the config file."""
        return ConfigFields(self.cfg, self.where)

    def attention(self, what: str = "this tool") -> MlaShape | V4Shape:
        """The attention shape (``attention_shape``); ``what`` names the reader in the error for
        attention it does not price."""
        return attention_shape(self.cfg, self.where, what)


def read_model(path: str | os.PathLike) -> ModelFiles:
    """A model folder (or its config.json) read and checked: the config's MoE fields first."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILE
    raw = load_json(path, "model config")
    if not isinstance(raw, dict):
        raise SceneEplbError("model config is not a JSON object", path)
    geometry = from_hf_config(raw, str(path))
    cfg = text_config(raw, str(path))
    if "quantization_config" in raw and "quantization_config" not in cfg:
        cfg = {**cfg, "quantization_config": raw["quantization_config"]}
    modelslim = None
    slim = path.parent / MODELSLIM_FILE
    if slim.is_file():
        modelslim = load_json(slim, MODELSLIM_FILE)
        if not isinstance(modelslim, dict):
            raise SceneEplbError(f"{MODELSLIM_FILE} is not a JSON object", slim)
    return ModelFiles(path, cfg, modelslim, geometry)
