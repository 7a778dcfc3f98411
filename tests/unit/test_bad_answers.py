"""A hostile server's corpus, generated here: servers on 127.0.0.1, started by the test in a thread,
that speak no HTTP, cut their bodies short, nest JSON 100,000 deep, send escape sequences, leave keys
out, send the wrong types or a 20 KB error page. Every command that talks to a server (``watch``,
``record``, ``audit``, ``advise --url``, ``bench``) ends in one line ``scene-eplb: error: ...`` that
names the problem, exit 2 (never 3, an internal error), no traceback, no escape sequence on the
terminal and nothing written. The counts files whose sums could wrap and the JSON outputs that
could hold NaN close the corpus.

The commands run in this process (``cli.main``) for speed, as in ``test_bad_input.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import socket
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from vllm_scene_eplb import cli
from vllm_scene_eplb.commands.console import Console
from vllm_scene_eplb.formats import write_counts
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.protocol import (
    ROUTE_BY_ACTION,
    DumpAnswer,
    NativeLoadAnswer,
    StatusAnswer,
    WorkerStatus,
)

from ..conftest import skewed_counts
from .test_protocol import status_with_time

pytestmark = pytest.mark.timed  # asserts on time or waits on a tight deadline: the first lane (tests/conftest.py)

ESC = "\x1b]0;owned\x07\x1b[2J"
CLOSE, HANG = "close", "hang"  # answers that are no bytes: drop the connection; never answer
MODEL = "tiny-moe"


def reply(
    body: bytes | str | object, status: str = "200 OK", ctype: str = "application/json", length: int | None = None
) -> bytes:
    """An HTTP/1.1 answer; ``body`` as JSON unless bytes or text; ``length``: a Content-Length that lies."""
    raw = body if isinstance(body, bytes) else body.encode() if isinstance(body, str) else json.dumps(body).encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(raw) if length is None else length}\r\n"
    return (head + "Connection: close\r\n\r\n").encode() + raw


class HostileServer:
    """A TCP server on 127.0.0.1 that answers each request path with fixed bytes (404 JSON for any
    other path), ``CLOSE`` by dropping the connection, ``HANG`` by never answering."""

    def __init__(self, routes: dict[str, bytes | str]):
        self.routes = routes
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            head = b""
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
            parts = head.split(b" ", 2)
            path = parts[1].decode(errors="replace").split("?")[0] if len(parts) > 1 else ""
            answer = self.routes.get(path, reply({"detail": "Not Found"}, "404 Not Found"))
            if answer == HANG:
                self.stop.wait(30)
            elif answer != CLOSE:
                with contextlib.suppress(OSError):
                    conn.sendall(answer)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def worker_status(ep_rank: int = 0, **changed) -> dict:
    """One worker's status as a real plugin answers it (``protocol.STATUS_KEYS``)."""
    return {
        "plugin_version": "0.1.0",
        "engine": "vllm 0.32.0",
        "model": MODEL,
        "role": "prefill",
        "ep_size": 2,
        "ep_rank": ep_rank,
        "dp_rank": 0,
        "tp_rank": ep_rank,
        "layout_hash": None,
        "layout_path": None,
        "redundant_slots": 0,
        "dispatch": None,
        "observer": "idle",
        "recording": False,
        "ring_entries": 64,
        "entries_written": 3,
        "passes_recorded": 3,
        "steps_per_entry": 1,
        "skipped_passes": 0,
        "skipped_recorded": 0,
        "live_counts": True,
        "moe_layers": [0, 1],
        "top_k": 2,
        "expert_groups": None,
        "server_start": "5f0c9a2e",
        **changed,
    }


LIVE = {
    "median": 1.05,
    "worst": 1.2,
    "expected_median": None,
    "expected_worst": None,
    "drift": False,
    "passes": 12,
    "window_seconds": 5.0,
    "windows": 3,
    "threshold": None,
    "dispatch": "dynamic",
    "layers": [0, 1],
    "per_layer": [1.05, 1.2],
    "measured": None,
    "fidelity": None,
    "time": None,
    "record_time": None,
    "drafter": None,
}


def status(live: dict | None = LIVE, **rank0) -> dict:
    """The status route's answer of a two-rank server (``protocol.StatusAnswer.of_ranks`` plus ``live``);
    ``rank0`` changes EP rank 0's status, unchecked (what a broken server could send)."""
    ranks = [dataclasses.replace(WorkerStatus.from_wire(worker_status(0)), **rank0), WorkerStatus.from_wire(worker_status(1))]
    return {**StatusAnswer.of_ranks(ranks).to_wire(), "live": live}


MODELS = reply({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
STATUS = ROUTE_BY_ACTION["status"].path
DUMP = ROUTE_BY_ACTION["dump"].path
NATIVE = ROUTE_BY_ACTION["native_load"].path
HTML_502 = "<html><head><title>502 Bad Gateway</title></head><body>" + "<p>upstream gone</p>" * 1000 + "</body></html>"
DEEP = "[" * 100_000 + "]" * 100_000
STRING_DP_RANK = status()
STRING_DP_RANK["ranks"][1]["dp_rank"] = "1"

STATUS_NO_LAYOUT_HASH = {k: v for k, v in status().items() if k != "layout_hash"}
WATCH, RECORD = ("watch", "--once"), ("record", "status")
BENCH = ("bench", "--served-model-name", MODEL, "--scene", "s", "-n", "1", "-c", "1", "--input-len", "8", "--output-len", "1")

# (id, what the server answers at each path, the command, what its one error line must say)
CASES = [
    ("watch: not HTTP", {STATUS: b"SSH-2.0-OpenSSH_9.6\r\n"}, WATCH, "reply is not HTTP"),
    ("record status: not HTTP", {STATUS: b"SSH-2.0-OpenSSH_9.6\r\n"}, RECORD, "reply is not HTTP"),
    (
        "advise --url: not HTTP",
        {STATUS: b"\x00\x01\x02 garbage\r\n\r\n"},
        ("advise", "{counts}", "--layout", "{layout}"),
        "reply is not HTTP",
    ),
    ("bench: not HTTP", {"/v1/models": b"SSH-2.0-OpenSSH_9.6\r\n"}, BENCH, "reply is not HTTP"),
    (
        "advise --url: status without layout_hash",
        {STATUS: reply(STATUS_NO_LAYOUT_HASH)},
        ("advise", "{counts}", "--layout", "{layout}"),
        "no 'layout_hash'",
    ),
    (
        "advise --url: the window's layout_hash a number",
        {STATUS: reply(status_with_time(provenance={"layout_hash": 5}))},
        ("advise", "{counts}", "--layout", "{layout}"),
        "provenance layout_hash must be a string or null, got 5",
    ),
    ("audit: not HTTP", {STATUS: b"\xff\xfe\r\n\r\n"}, ("audit",), "reply is not HTTP"),
    ("watch: body cut short", {STATUS: reply('{"live": {"median"', length=1000)}, WATCH, "cut short"),
    ("record status: dropped connection", {STATUS: CLOSE}, RECORD, "closed the connection without an answer"),
    ("record status: no answer in time", {STATUS: HANG}, (*RECORD, "--timeout", "0.5"), "no answer within 0.5 s"),
    ("record status: nested 100,000 deep", {STATUS: reply(DEEP)}, RECORD, "nested too deeply"),
    ("record status: not JSON", {STATUS: reply("hello", ctype="text/plain")}, RECORD, "not JSON"),
    ("record status: NaN", {STATUS: reply('{"ep_size": NaN}')}, RECORD, "NaN is not JSON"),
    ("record status: escape sequences in an error", {STATUS: reply(ESC, "500 Oops", "text/plain")}, RECORD, "HTTP 500"),
    ("record status: 502 with 20 KB of HTML", {STATUS: reply(HTML_502, "502 Bad Gateway", "text/html")}, RECORD, "HTTP 502"),
    ("watch: status is a number", {STATUS: reply(42)}, WATCH, "status answer must be a JSON object, got 42"),
    ("watch: status has no live", {STATUS: reply({k: v for k, v in status().items() if k != "live"})}, WATCH, "no 'live'"),
    (
        "watch: live without window_seconds",
        {STATUS: reply(status({k: v for k, v in LIVE.items() if k != "window_seconds"}))},
        WATCH,
        "no 'window_seconds'",
    ),
    ("watch: live median a string", {STATUS: reply(status({**LIVE, "median": "1.05"}))}, WATCH, "median must be a finite number"),
    (
        "watch: live moe_share 3.5",
        {STATUS: reply(status({**LIVE, "time": {"median": 1, "worst": 1, "moe_share": 3.5}}))},
        WATCH,
        "moe_share",
    ),
    (
        "watch: live record_time a list",
        {STATUS: reply(status({**LIVE, "record_time": [1]}))},
        WATCH,
        "record_time must be an object",
    ),
    ("record status: ep_size 0", {STATUS: reply(status(ep_size=0))}, RECORD, "ep_size must be an integer >= 1"),
    ("record status: observer bogus", {STATUS: reply(status(observer="bogus"))}, RECORD, "observer must be one of"),
    ("record status: a rank's dp_rank a string", {STATUS: reply(STRING_DP_RANK)}, RECORD, "ranks[1] dp_rank"),
    ("bench: a rank's dp_rank a string", {"/v1/models": MODELS, STATUS: reply(STRING_DP_RANK)}, BENCH, "ranks[1] dp_rank"),
    (
        "bench: another model served",
        {"/v1/models": reply({"data": [{"id": "other"}]})},
        BENCH,
        "serves 'other', not --served-model-name",
    ),
    (
        "bench: the path given, not the name it is served as",
        {"/v1/models": reply({"data": [{"id": "ds", "root": MODEL}]})},
        BENCH,
        f"it serves the path {MODEL!r} as --served-model-name 'ds'",
    ),
    ("bench: no model list", {"/v1/models": reply({"models": []})}, BENCH, "not an OpenAI one"),
    ("record dump: status ok", {DUMP: reply({"status": "ok"})}, ("record", "dump"), "dump answer has no 'path'"),
    ("record dump: path null", {DUMP: reply({"path": None})}, ("record", "dump"), "path must be the path of the file written"),
    ("record native_load: available only", {NATIVE: reply({"available": True})}, ("record", "native_load"), "no 'moe_layers'"),
    (
        "record native_load: ragged counts",
        {NATIVE: reply({"available": True, "ranks": 1, "moe_layers": [0, 1], "counts": [[1, 2], [3]]})},
        ("record", "native_load"),
        "counts row 1",
    ),
    (
        "record native_load: negative counts",
        {NATIVE: reply({"available": True, "ranks": 1, "moe_layers": [0], "counts": [[1, -2]]})},
        ("record", "native_load"),
        "counts row 0",
    ),
]


def run(*args) -> tuple[int, str, str]:
    """``scene-eplb ARGS`` in this process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_refused(code: int, out: str, err: str, expected: str, workdir: Path, before: set) -> None:
    """One printable error line naming the problem, exit 2 (never 3), no traceback, nothing written."""
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(lines) == 1 and lines[0].startswith("scene-eplb: error: "), lines
    assert expected in lines[0], lines[0]
    assert len(lines[0]) < 700, len(lines[0])  # an error page comes back shortened
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert set(workdir.rglob("*")) == before, set(workdir.rglob("*")) - before


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """A counts dump and a fitted layout, for ``advise --url``."""
    d = tmp_path_factory.mktemp("inputs")
    counts = write_counts(Counts(skewed_counts(4, 2, 8), {"model": MODEL, "moe_layers": [0, 1]}), d / "dump.npz")
    code, _, err = run("fit", counts, "--ep-size", "2", "--redundant", "2", "-o", d / "layout.json", "-q")
    assert code == 0, err
    return {"counts": counts, "layout": d / "layout.json"}


@pytest.mark.parametrize("name, routes, command, expected", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_server_is_one_line(name, routes, command, expected, inputs, tmp_path):
    server = HostileServer(routes)
    try:
        args = [a.format(**inputs) for a in command] + ["--url", server.url]
        if command[0] == "bench":
            args += ["-o", tmp_path / "r.json", "--cards", "2"]
        before = set(tmp_path.rglob("*"))
        assert_refused(*run(*args), expected, tmp_path, before)
    finally:
        server.close()


def test_bench_against_a_closed_port_fails_in_about_a_second(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    start = time.perf_counter()
    code, out, err = run(*BENCH, "--url", f"http://127.0.0.1:{port}", "-o", tmp_path / "r.json", "--cards", "1")
    assert time.perf_counter() - start < 5
    assert_refused(code, out, err, "cannot reach the server", tmp_path, set())


def test_bench_without_cards_needs_a_status_route(tmp_path):
    """A server with no plugin (404 on the status route) is NOT_OBSERVED, not an error: the card count must be given."""
    server = HostileServer({"/v1/models": MODELS})
    try:
        assert_refused(*run(*BENCH, "--url", server.url, "-o", tmp_path / "r.json"), "--cards is needed", tmp_path, set())
    finally:
        server.close()


def test_server_strings_reach_the_terminal_escaped():
    """A valid answer whose strings hold escape sequences: printed, but as visible escapes."""
    server = HostileServer({STATUS: reply(status({**LIVE, "dispatch": ESC}, dispatch=ESC))})
    try:
        for args in (WATCH, RECORD):
            code, out, err = run(*args, "--url", server.url)
            assert code == 0, err
            assert "\x1b" not in out + err and "\\x1b]0;owned\\x07" in out, out
        code, out, _ = run(*WATCH, "--json", "--url", server.url)
        assert json.loads(out)["dispatch"] == ESC  # JSON carries the string itself, escaped by JSON
    finally:
        server.close()


def test_the_answer_readers_take_what_the_server_sends_key_for_key():
    wire = status(
        {
            **LIVE,
            "measured": {"median": 1.0, "worst": 1.1, "per_layer": [1.0, 1.1]},
            "time": {
                "median": 1,
                "worst": 1,
                "moe_share": None,
                "step_ms": None,
                "rank_ms": [[0.5, 0.25], [0.5, 0.25]],
                "per_layer": [1.0, 1.0],
                "rank_assignments": None,
                "sub_windows": [],
                "provenance": {},
                "gap_ms": 12.5,
                "rank_active_slots": [[3.0, 2.0], [4.0, 1.0]],
                "wait_share": 0.01,
                "pass_groups": [
                    {
                        "tokens": [512, None],
                        "passes": 3,
                        "rank_ms": [[0.5, 0.25], [0.5, 0.25]],
                        "rank_assignments": [[3.0, 2.0], [4.0, 1.0]],
                        "rank_active_slots": [[3.0, 2.0], [4.0, 1.0]],
                    }
                ],
                "critical_ms": 0.8,  # a record window's critical path measured pass by pass, over its 3 passes
                "critical_passes": 3,
            },
            "drafter": {"layers": [3], "median": 1.1, "worst": 1.1, "per_layer": [1.1], "share": 0.02},  # an MTP layer, apart
        }
    )
    assert StatusAnswer.from_wire(wire).to_wire() == wire
    dump = {
        "export_id": "x",
        "state": "done",
        "path": "/d/counts.npz",
        "error": None,
        "export_seconds": 0.5,
        "ep_rank": 0,
        "shape": [64, 2, 8],
        "physical_shape": None,
        "entries_written": 3,
        "passes_recorded": 3,
        "local_total": 48,
        "ranks": 2,
    }
    assert DumpAnswer.from_wire(dump).to_wire() == dump
    for native in (
        {"available": True, "moe_layers": [0, 1], "counts": [[1, 2], [3, 4]], "ranks": 2},
        {"available": False, "reason": "no record has stopped yet", "ranks": 2},
    ):
        assert NativeLoadAnswer.from_wire(native).to_wire() == native


# ------------------------------------------------------------------ sums that cannot wrap, JSON that stays JSON


def test_physical_counts_that_would_wrap_int64_are_refused(tmp_path):
    """2048 slots of 2**53 sum to 2**64, 0 in int64: the logical total 0 'matched' before the cap."""
    doc = {"logical_count": [[[0] * 8]], "physical_count": [[[2**53] * 2048]]}
    path = tmp_path / "wrap.json"
    path.write_text(json.dumps(doc))
    code, out, err = run("inspect", path, "-q")
    assert_refused(code, out, err, "physical_count sums to", tmp_path, {path})


def test_a_huge_physical_header_is_named_physical_count(tmp_path):
    good = write_counts(Counts(np.ones((4, 4, 8), dtype=np.int64)), tmp_path / "good.npz")
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, src.read(name))
        fake = io.BytesIO()
        np.lib.format.write_array_header_1_0(fake, {"descr": "<i8", "fortran_order": False, "shape": (4, 4, 10**15)})
        dst.writestr("physical_count.npy", fake.getvalue())
    code, out, err = run("inspect", path, "-q")
    assert_refused(code, out, err, "physical_count [4, 4, 1000000000000000]", tmp_path, {good, path})


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in --json output")

    return json.loads(text, parse_constant=refuse)


def test_inspect_json_stays_json_with_nan_metadata(tmp_path):
    path = write_counts(Counts(np.ones((2, 2, 4), dtype=np.int64), {"scheduled_tokens": float("nan")}), tmp_path / "nan.npz")
    code, out, err = run("inspect", path, "--json", "-q")
    assert code == 0, err
    doc = _strict(out)
    assert doc["non_finite"] and all("nan" in w for w in doc["non_finite"])


def test_json_output_has_null_for_infinity():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        Console(json=True).emit({"ratio": 1e300 / 1e-300, "ok": 1.0, "rows": [float("-inf")]}, "")
    doc = _strict(out.getvalue())
    assert doc["ratio"] is None and doc["rows"] == [None] and doc["ok"] == 1.0
    assert doc["non_finite"] == ["$.ratio: inf", "$.rows[0]: -inf"]
