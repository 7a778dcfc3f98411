"""A small simulated server for the advise tests: a skewed scene whose fitted layout pays, its dump
and its timing window (``rig.simulated``), written to files for the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import write_counts, write_layout
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.protocol import LiveAnswer, LiveTime, StatusAnswer, TimingWindow
from vllm_scene_eplb.rig.simulated import Device, Server, SimulatedTraffic

from .conftest import worker_status

E, L, EP = 16, 4, 2
DEVICE = Device(a_ms=0.05, b_ms=0.002, other_ms=3.0)
# the hot experts all on rank 0 of the linear layout (experts 0-7 there)
SKEWED = np.tile(np.array([8, 6, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1], dtype=float), (L, 1))
SKEWED /= SKEWED.sum(axis=1, keepdims=True)
EVEN = np.full((L, E), 1 / E)


def scene(p: np.ndarray = SKEWED, tokens: int = 64) -> SimulatedTraffic:
    return SimulatedTraffic(p, tokens, 4, "decode")


def server(s: SimulatedTraffic | None = None, running=None, dispatch: str = "dynamic") -> Server:
    return Server(s or scene(), DEVICE, EP, running, dispatch)


def candidate(counts: Counts, dispatch: str = "static"):
    total = Counts(counts.total()[None], {"moe_layers": list(range(L))})
    return fit(total, FitOptions(Geometry(E, 2, EP), dispatch=dispatch))


def write_case(d: Path, passes: int = 128, steps_per_entry: int = 1, seed: int = 0) -> dict[str, Path]:
    """dump.npz, cand.json and status.json (a status answer around its live.time) of one skewed scene."""
    srv = server()
    rec = srv.scene.passes(passes, np.random.default_rng(seed))
    counts = srv.dump(rec, steps_per_entry)
    window = srv.timing_window(rec, steps_per_entry)
    paths = {"dump": d / "dump.npz", "cand": d / "cand.json", "status": d / "status.json"}
    write_counts(counts, paths["dump"])
    write_layout(candidate(counts), paths["cand"])
    paths["status"].write_text(json.dumps(status_answer(window)))
    return paths


def status_answer(window: TimingWindow) -> dict:
    """The status route's answer of a server whose ``live.time`` is ``window`` (its status keys the
    window's provenance), as ``advise --timing`` reads a saved one."""
    prov = window.provenance
    ranks = [
        worker_status(
            r,
            **prov,
            model="simulated",
            layout_path=None,
            tp_rank=r,
            dp_rank=0,
            live_counts=True,
            top_k=4,
            moe_layers=list(range(L)),
        )
        for r in range(window.ranks)
    ]
    ms = np.asarray(window.rank_ms)
    per_layer = tuple(float(x) for x in ms.max(axis=0) / ms.mean(axis=0))
    time = LiveTime(
        float(np.median(per_layer)), max(per_layer), window.moe_share, window.step_ms, window.rank_ms, per_layer,
        window.rank_assignments, window.sub_windows, dict(prov), window.gap_ms,
    )  # fmt: skip
    live = LiveAnswer(
        None, None, None, None, False, 1, 5.0, 1, None, prov["dispatch"], tuple(range(L)), None, None, None, time
    )  # fmt: skip
    return StatusAnswer.of_ranks(ranks, live).to_wire()
