"""The test sessions' server zygote (``rig.server_zygote``) on a small module instead of vLLM's API
server (tests/scripts/zygote_child.py): a forked child runs as ``python -m MODULE ARGS`` started here
would (the caller's environment with what the module's imports set, working folder and umask, its own
session, its log), its exit code and a signal's come back, and a caller whose environment differs in
more than the runtime variables is refused."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

import pytest

from vllm_scene_eplb.rig.server_zygote import ForkedProcess, Zygote, read_line

from ..conftest import SCRIPTS


@pytest.fixture
def zygote(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS), "ZYGOTE_MARK": "the zygote's"}
    z = Zygote.start(tmp_path, env, runtime=("ZYGOTE_MARK",), module="zygote_child")
    yield z, env
    z.stop()


def _forked(z: Zygote, env: dict, log, *args: str, **more: str) -> ForkedProcess:
    proc = z.fork(list(args), {**env, **more}, log)
    assert proc is not None, (z.path.parent / "zygote.log").read_text()
    return proc


def test_a_child_runs_as_a_new_process_would_and_its_exit_code_comes_back(zygote, tmp_path, monkeypatch):
    z, env = zygote
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    old = os.umask(0o027)
    try:
        proc = _forked(z, env, tmp_path / "child.log", "3", "--flag", ZYGOTE_MARK="the caller's")
    finally:
        os.umask(old)
    assert proc.wait(timeout=60) == 3 and proc.poll() == 3
    seen = json.loads((tmp_path / "child.log").read_text().splitlines()[-1])
    assert seen["argv"] == ["3", "--flag"]
    assert seen["cwd"] == str(work) and seen["mark"] == "the caller's" and seen["umask"] == 0o027
    assert seen["set_at_import"] == "yes"  # what the module's import did to the environment, as in a new process
    assert seen["sid"] == seen["pid"] == proc.pid  # its own session, as start_new_session gives


def test_a_signal_ends_a_child_with_the_code_popen_would_give(zygote, tmp_path):
    z, env = zygote
    log = tmp_path / "sleeper.log"
    proc = _forked(z, env, log, "sleep")
    for _ in range(600):  # until it has started (its line is in its log)
        if log.exists() and log.read_text().strip():
            break
        time.sleep(0.1)
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM


@pytest.mark.parametrize("other", [{"PYTHONPATH": os.pathsep + sys.prefix}, {"SCENE_EPLB_TEST_FORCE_AVX2": "1"}])
def test_a_caller_whose_environment_differs_beyond_the_runtime_variables_is_refused(zygote, tmp_path, other):
    """Another path, or a variable a ``sitecustomize`` reads as the interpreter starts: not the zygote's start."""
    z, env = zygote
    assert z.fork(["0"], {**env, **{k: env.get(k, "") + v for k, v in other.items()}}, tmp_path / "x.log") is None
    assert not (tmp_path / "x.log").exists()
    assert _forked(z, env, tmp_path / "ok.log", "0").wait(timeout=60) == 0  # the zygote still serves


def test_an_exit_code_that_arrives_with_the_pid_is_kept():
    """A child that ends at once: its exit code can reach the caller in the same read as its pid."""
    zygote_end, caller_end = socket.socketpair()
    zygote_end.sendall(b'{"pid": 2147483647}\n{"returncode": 3}\n')
    zygote_end.close()
    answer, rest = read_line(caller_end)
    assert ForkedProcess(answer["pid"], caller_end, _buffer=rest).poll() == 3
