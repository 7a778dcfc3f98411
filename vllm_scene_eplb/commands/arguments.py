"""The argument groups several commands share (output, geometry of bare layout files, server, model),
each beside the reader that turns its options into what the library takes (``hint``, ``read_model_arg``,
``model_memory``)."""

from __future__ import annotations

import argparse
import os

from ..errors import SceneEplbError
from ..formats import GeometryHint
from ..layouts.layout import Layout
from ..planning.memory import KV_CACHE_DTYPES, ModelMemory, read_model_memory
from ..planning.model_files import ModelFiles, read_model
from .options import integer


def output_args(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``-q`` and ``--debug``, which every command takes."""
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--debug", action="store_true", help="on an internal error, print its traceback")


def geometry_args(parser: argparse.ArgumentParser) -> None:
    """The geometry a bare layout file (SGLang, vLLM-Ascend, .pt) cannot carry itself."""
    g = parser.add_argument_group("geometry of bare layout files (SGLang, vLLM-Ascend, .pt carry none or part of it)")
    g.add_argument("--ep-size", type=integer(1), help="expert-parallel ranks")
    g.add_argument("--num-experts", type=integer(1), help="logical experts (default: largest id + 1)")
    g.add_argument("--nodes", type=integer(1), help="nodes the EP ranks span (default 1)")


def hint(args: argparse.Namespace) -> GeometryHint:
    return GeometryHint(getattr(args, "ep_size", None), getattr(args, "num_experts", None), getattr(args, "nodes", None))


def server_args(
    parser: argparse.ArgumentParser,
    url_default: str | None = "http://localhost:8000",
    url_help: str | None = None,
    url_required: bool = False,
    url: bool = True,
) -> None:
    """``--url`` (unless not ``url``: a command that names its servers its own way) and ``--api-key`` of
    a running server (the key defaults to $VLLM_API_KEY, as vLLM's own)."""
    if url and url_required:
        parser.add_argument("--url", required=True, help="server base URL")
    elif url:
        parser.add_argument("--url", default=url_default, help=url_help or f"server base URL (default {url_default})")
    parser.add_argument(
        "--api-key", default=os.environ.get("VLLM_API_KEY"), help="the server's --api-key (default: $VLLM_API_KEY)"
    )


MODEL_HELP = "the model's folder (config.json, its quantisation config and checkpoint), or its config.json"


def model_arg(parser, required: bool = False, help: str = MODEL_HELP) -> None:
    """``--model DIR``, the one spelling of a model in every command (``required`` where the command
    reads nothing else)."""
    parser.add_argument("--model", metavar="DIR", required=required, help=help)


def model_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """``--model`` and how to price its memory."""
    g = parser.add_argument_group("model (a Hugging Face model folder: config.json and its quantisation config)")
    model_arg(
        g,
        required,
        "the served model's folder or its config.json: its layers and experts must be the inputs', routing groups "
        "and top-k come from it, and the output says what the redundant slots cost in memory and KV cache",
    )
    pricing_args(g)


def pricing_args(group) -> None:
    """``--kv-cache-dtype`` and ``--expert-bytes``: how a model's KV token and routed expert are priced."""
    group.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default="auto",
        help="the server's --kv-cache-dtype, to price a KV token (default auto: the model's dtype)",
    )
    group.add_argument(
        "--expert-bytes",
        type=integer(1, 1 << 50),
        metavar="N",
        help="bytes of one routed expert in one layer, when the checkpoint's quantisation is not one this tool prices",
    )


def read_model_arg(args: argparse.Namespace) -> ModelFiles | None:
    """``--model`` read once (``read_model``), None without it; ``--expert-bytes`` alone is an error
    (it prices the experts of ``--model``)."""
    if not getattr(args, "model", None):
        if getattr(args, "expert_bytes", None) is not None:
            raise SceneEplbError("--expert-bytes prices the experts of --model: give --model DIR too")
        return None
    return read_model(args.model)


def model_memory(args: argparse.Namespace, model: ModelFiles | None) -> ModelMemory | None:
    """The memory prices of ``model`` as ``model_args`` ask (None without a model)."""
    if model is None:
        return None
    return read_model_memory(model, args.kv_cache_dtype, args.expert_bytes)


def check_layout_model(layout: Layout, model: ModelFiles, path: str, ep_size: int) -> None:
    """Refuse a layout made for another model than ``--model`` (its MoE layers, their rows on the
    model's layer axis, its experts) or another EP size, naming the layout file."""
    g = model.geometry
    try:
        layout.check_model(len(g.moe_layers), g.num_experts, ep_size, g.moe_layers, g.num_layers)
    except SceneEplbError as exc:
        raise SceneEplbError(f"--model {model.folder}: {exc.problem}", path) from None
