"""collect.sh's warm check of a cache scene, at the shell (``deploy/ascend-910c/env.sh``: ``metrics`` reads a
server's /metrics with curl, ``warm_check`` runs ``scene-eplb warm-check`` on two reads).

The server is a local HTTP server whose /metrics pages vLLM 0.23's own ``PrometheusStatLogger`` wrote
(tests/scripts/vllm023_prefix_metrics.py, in the released code tests/ascend_env.py sets up): two DP
engines' ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` counters with their ``engine`` labels,
before and after a load of the field's 128K warm scene (131,076-token prompts, share 0.9062). A server
whose hits stay 0 and one at half the share are refused in one line; one at the scene's share passes,
and the record it brackets carries the measured share in its metadata, which ``fit`` and ``report`` print.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from vllm_scene_eplb.formats import read_counts, write_counts
from vllm_scene_eplb.layouts.counts import Counts

from ..ascend_env import run as ascend_run
from ..conftest import cli
from ..repository.test_deploy import DEPLOY
from ..repository.test_deploy import _env as deploy_env

IN_LEN, SHARE = 131076, 0.9062
QUERIES = 20 * IN_LEN  # each DP engine's queried tokens over the load: 20 prompts
CASES = {
    "hits stay 0": [[0, QUERIES], [0, QUERIES]],
    "half the share": [[round(QUERIES * SHARE / 2), QUERIES]] * 2,
    "the scene's share": [[20 * 118784, QUERIES], [20 * 118272, QUERIES]],  # 928 and 924 blocks of 128 hit
}


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict:
    from vllm_scene_eplb.rig.tiny_deepseek_v4 import make_tiny_deepseek_v4

    model = make_tiny_deepseek_v4(tmp_path_factory.mktemp("metrics") / "tiny-v4")
    return ascend_run("vllm023_prefix_metrics", str(model), json.dumps(CASES))


@contextlib.contextmanager
def serving(texts: list[str]):
    """A local server whose GET /metrics answers ``texts`` one after the other (the last one after them)."""
    served = []

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the handler's name in http.server
            body = texts[min(len(served), len(texts) - 1)].encode()
            served.append(self.path)
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


def _warm_check(url: str, folder: Path, counts: Path | None = None) -> subprocess.CompletedProcess:
    """collect.sh's steps around a load, as it runs them: /metrics before and after, then the check."""
    stamp = f' "{counts}"' if counts else ""
    script = (
        f'source "{DEPLOY}/env.sh" && metrics "{url}" "{folder}/before.txt" && metrics "{url}" "{folder}/after.txt" && '
        f'warm_check "{folder}/before.txt" "{folder}/after.txt"{stamp}'
    )
    env = deploy_env(RECIPE="v4-flash-field", IN_LEN=str(IN_LEN), OUT_LEN="1024", PREFIX_SHARE=str(SHARE))
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)


def _errors(res: subprocess.CompletedProcess) -> list[str]:
    return [line for line in res.stderr.splitlines() if not line.startswith("env.sh:")]


def test_collect_warm_check_refuses_a_server_whose_hits_stay_zero(pages, tmp_path):
    with serving(pages["hits stay 0"]) as (url, served):
        res = _warm_check(url, tmp_path)
    assert served == ["/metrics", "/metrics"]
    assert res.returncode == 2 and len(_errors(res)) == 1, res.stderr
    assert _errors(res)[0].startswith(
        "scene-eplb: error: warm check: no prefix-cache hit between the two reads (5,243,040 tokens"
    )


def test_collect_warm_check_refuses_half_the_scenes_share(pages, tmp_path):
    with serving(pages["half the share"]) as (url, _):
        res = _warm_check(url, tmp_path)
    assert res.returncode == 2 and len(_errors(res)) == 1, res.stderr
    assert "under the scene's 0.9062 by more than 0.02 on engine 0 0.4531, engine 1 0.4531" in _errors(res)[0]


def _record(path: Path) -> Path:
    """A recorded P dump of V4-Flash's shape (43 MoE layers, 256 experts, top-6), every layer routed."""
    data = np.random.default_rng(0).integers(1, 50, size=(4, 43, 256)).astype(np.int64)
    return write_counts(Counts(data, {"role": "prefill", "top_k": 6, "expert_groups": 1, "moe_layers": list(range(43))}), path)


def test_collect_warm_check_at_the_scenes_share_records_and_the_dump_carries_it(pages, tmp_path):
    record = _record(tmp_path / "counts-prefill.npz")
    before = read_counts(record)
    with serving(pages["the scene's share"]) as (url, _):
        res = _warm_check(url, tmp_path, record)
    assert res.returncode == 0, res.stderr
    assert "warm: prefix-cache hit share 0.9043 (scene 0.9062, 2 DP engines 0.9023-0.9062)" in res.stdout
    stamped = read_counts(record)  # its checksum renewed: read_counts checks it
    meta = stamped.meta["prefix_cache"]
    assert meta["hit_share"] == round(20 * (118784 + 118272) / (2 * QUERIES), 6) and meta["engines"] == {
        "0": round(118784 / IN_LEN, 6),
        "1": round(118272 / IN_LEN, 6),
    }
    assert np.array_equal(stamped.data, before.data) and stamped.meta["role"] == "prefill"
    fit = cli("fit", record, "--ep-size", "16", "--redundant", "16", "-o", tmp_path / "layout.json")
    assert fit.returncode == 0, fit.stderr
    said = f"{record}: recorded warm, prefix-cache hit share 0.9043 (scene 0.9062, 2 DP engines 0.9023-0.9062)"
    assert said in fit.stdout
    report = cli("report", tmp_path / "layout.json", record, "-o", tmp_path / "report")
    assert report.returncode == 0 and said in report.stdout, report.stderr
