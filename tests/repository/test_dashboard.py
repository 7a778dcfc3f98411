"""The Grafana dashboard in deploy/grafana: every metric an expression names is one the plugin or
vLLM 0.32 exports, and every plugin gauge has a panel."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from vllm_scene_eplb.runtime.server import metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "scene-eplb-dashboard.json"
NAME = re.compile(r"\b(scene_eplb_[a-z_]+|vllm:[a-z_:]+)")
PLUGIN = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str) and v.startswith("scene_eplb_")}


def _vllm_exported() -> set[str]:
    """What vLLM 0.32's Prometheus logger exports: its metric names as the source declares them,
    with the suffixes prometheus_client adds (counters _total, histograms _bucket/_sum/_count)."""
    spec = importlib.util.find_spec("vllm.v1.metrics.loggers")
    if spec is None or spec.origin is None:
        pytest.fail("vLLM is not importable; run scripts/setup.sh")
    declared = set(re.findall(r'name="(vllm:[a-z_:]+)"', Path(spec.origin).read_text()))
    return {n + suffix for n in declared for suffix in ("", "_total", "_bucket", "_sum", "_count")}


def _expressions(doc: dict) -> list[str]:
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in doc["templating"]["list"] if v.get("type") == "query"]
    return exprs


def test_every_expression_names_a_metric_the_plugin_or_vllm_exports():
    doc = json.loads(DASHBOARD.read_text())
    known = PLUGIN | _vllm_exported()
    names = {n for e in _expressions(doc) for n in NAME.findall(e)}
    assert names and not names - known, sorted(names - known)
    assert "vllm:made_up_tokens_total" not in known and "scene_eplb_made_up" not in known  # the check can fail


def test_every_plugin_gauge_has_a_panel_and_vllm_throughput_and_latency_sit_beside_them():
    doc = json.loads(DASHBOARD.read_text())
    names = {n for e in _expressions(doc) for n in NAME.findall(e)}
    assert PLUGIN <= names, sorted(PLUGIN - names)
    assert {
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
    } <= names
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["uid"]
