"""What the commands share: the console (``--json``, ``-q``), argument groups and the score summary."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

from ..evaluation import SCORES, Evaluation
from ..formats import GeometryHint


@dataclass(frozen=True)
class Console:
    """Where a command speaks: the result on stdout (JSON with ``--json``), progress on stderr
    unless ``quiet``. Passed to every command, so nothing reads a module-level switch."""

    quiet: bool = False
    json: bool = False

    @contextmanager
    def progress(self, what: str):
        """Say on stderr what is running and how long it took (stdout stays clean for --json)."""
        start = time.perf_counter()
        self.say(f"scene-eplb: {what}...")
        yield
        self.say(f"scene-eplb: {what}: done in {time.perf_counter() - start:.2f}s")

    def say(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stderr, flush=True)

    def emit(self, payload: dict, text: str) -> None:
        print(json.dumps(payload, indent=2) if self.json else text)


def output_args(parser: argparse.ArgumentParser) -> None:
    """``--json`` and ``-q``, which every command takes."""
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def geometry_args(parser: argparse.ArgumentParser) -> None:
    """The geometry a bare layout file (SGLang, vLLM-Ascend, .pt) cannot carry itself."""
    g = parser.add_argument_group("geometry of bare layout files (SGLang, vLLM-Ascend, .pt carry none or part of it)")
    g.add_argument("--ep-size", type=int, help="expert-parallel ranks")
    g.add_argument("--num-experts", type=int, help="logical experts (default: largest id + 1)")
    g.add_argument("--nodes", type=int, help="nodes the EP ranks span (default 1)")


def hint(args: argparse.Namespace) -> GeometryHint:
    return GeometryHint(getattr(args, "ep_size", None), getattr(args, "num_experts", None), getattr(args, "nodes", None))


def server_args(parser: argparse.ArgumentParser, url_default: str | None = "http://localhost:8000",
                url_help: str | None = None, url_required: bool = False) -> None:
    """``--url`` and ``--api-key`` of a running server (the key defaults to $VLLM_API_KEY, as vLLM's own)."""
    if url_required:
        parser.add_argument("--url", required=True, help="server base URL")
    else:
        parser.add_argument("--url", default=url_default, help=url_help or f"server base URL (default {url_default})")
    parser.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"), help="the server's --api-key (default: $VLLM_API_KEY)")


def summary_text(ev: Evaluation) -> str:
    """The score summary every scoring command prints: median and worst layer of each score."""
    s = ev.summary()
    out = [f"layout {s['layout_hash']}  fingerprint {s['fingerprint'] or '-'}  MoE layers {s['layers']}"]
    for score in SCORES:
        st = s[score.key]
        out.append(f"  {score.key:22s} " + ("NOT_OBSERVED" if st is None else f"median {st['median']:.4f}  worst {st['worst']:.4f}"))
    return "\n".join(out)
