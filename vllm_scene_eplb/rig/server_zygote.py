"""A Python that has imported vLLM's API server once and forks each test server's API server from
there (test sessions only: tests/conftest.py turns them on, ``local_server`` starts them). A server
start waits on three Python imports of vLLM in a row (API server, engine core, workers), about 9 s
each on two cores; the forked API server skips the first. It then runs ``python -m
vllm.entrypoints.openai.api_server ARGS`` as a new process would (its own session and log; the
caller's environment, working folder, cores, CPU priority and umask; ``runpy`` as ``-m`` does), and
vLLM spawns its engine core and workers from it unchanged. A caller whose environment differs in more
than the variables read once the server runs (another ``PYTHONPATH``, such as the V4 stand-ins') is
refused: it takes another zygote, or starts the server as a new process.

The zygote is single-threaded (it forks): one ``select`` loop accepts requests on a Unix socket,
forks, answers the child's pid, and on the child's exit writes its exit code to that request's
connection, which the caller holds as the process handle (``ForkedProcess``)."""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

API_SERVER = "vllm.entrypoints.openai.api_server"  # what ``python -m`` runs to serve
READY_TIMEOUT_S = 300.0  # a zygote's import of vLLM on a loaded 2-core host


def startup_env(env: dict[str, str], runtime: Collection[str]) -> dict[str, str]:
    """``env`` but the variables in ``runtime`` (read once the program runs): what a Python and its
    ``sitecustomize`` may read as they start (``PYTHONPATH``, the V4 stand-ins' switch...). A forked
    child keeps the zygote's start, so this part of its environment must be the zygote's."""
    return {k: v for k, v in env.items() if k not in runtime}


@dataclass
class ForkedProcess:
    """A forked API server, as much of ``subprocess.Popen`` as the rig uses: ``pid``, ``poll``,
    ``wait``, ``returncode``. Its exit code arrives on ``conn`` from the zygote that reaps it."""

    pid: int
    conn: socket.socket = field(repr=False)
    returncode: int | None = None
    _buffer: bytes = field(default=b"", repr=False)

    def poll(self) -> int | None:
        return self._read(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(API_SERVER, timeout or 0.0)
        return code

    def _read(self, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if b"\n" in self._buffer:
                self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["returncode"])
                break
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.conn], [], [], left)[0]:
                return None
            chunk = self.conn.recv(4096)
            if not chunk:  # the zygote went away before reaping the child: a liveness check is all there is
                return self._orphan(deadline)
            self._buffer += chunk
        self.conn.close()
        return self.returncode

    def _orphan(self, deadline: float | None) -> int | None:
        """The exit of a child its zygote no longer reaps: gone (code unknown, read as killed) or not yet."""
        import psutil  # vLLM's dependency, as in local_server

        while psutil.pid_exists(self.pid):
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.2)
        self.returncode = -signal.SIGKILL
        self.conn.close()
        return self.returncode


@dataclass
class Zygote:
    """The caller's side: the zygote's process and socket."""

    proc: subprocess.Popen
    path: Path

    @classmethod
    def start(
        cls, folder: Path, env: dict[str, str], runtime: Collection[str] = (), module: str = API_SERVER, name: str = "zygote"
    ) -> Zygote:
        """Start a zygote that imports ``module`` and runs it in each child, with ``env``; it forks for
        callers whose environment differs from it only in ``runtime`` variables. Its socket and log
        are in ``folder`` under ``name``."""
        path = folder / f"{name}.sock"
        log = open(folder / f"{name}.log", "wb")
        args = [sys.executable, "-m", __name__, str(path), module, json.dumps(sorted(runtime))]
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=os.getcwd())
        log.close()
        return cls(proc, path)

    def fork(self, args: list[str], env: dict[str, str], log: Path) -> ForkedProcess | None:
        """``python -m MODULE ARGS`` (the API server) forked from the zygote, or None where it refuses
        (another environment at startup) or is not running."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.2)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(self.path))
            request = {"args": args, "env": env, "log": str(log), **_inherited()}
            conn.sendall(json.dumps(request).encode() + b"\n")
            answer, rest = read_line(conn)
        except OSError:
            conn.close()
            return None
        if "pid" not in answer:
            conn.close()
            return None
        return ForkedProcess(int(answer["pid"]), conn, _buffer=rest)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _inherited() -> dict:
    """What a process started here would inherit beyond its environment: working folder, cores,
    CPU priority and umask (the forked child takes them on)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return {
        "cwd": os.getcwd(),
        "cores": sorted(os.sched_getaffinity(0)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "umask": mask,
    }


def read_line(conn: socket.socket, timeout: float = 60.0) -> tuple[dict, bytes]:
    """The first JSON line on ``conn`` ({} where it closes first), and what arrived after it (the
    exit code of a child that ended at once can come in the same read as its pid)."""
    conn.settimeout(timeout)
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return {}, b""
        data += chunk
    conn.settimeout(None)
    line, rest = data.split(b"\n", 1)
    return json.loads(line), rest


@dataclass(frozen=True)
class EnvChange:
    """What a process did to its environment since it started (its ``sitecustomize`` and imports:
    importing vLLM sets ``TORCHINDUCTOR_COMPILE_THREADS``, ``LD_LIBRARY_PATH``...): a forked child
    applies it to the caller's environment, so the processes it starts inherit what a new one's would."""

    set: dict[str, str]
    unset: tuple[str, ...]

    @classmethod
    def since_start(cls, started: dict[str, str]) -> EnvChange:
        now = dict(os.environ)
        return cls({k: v for k, v in now.items() if started.get(k) != v}, tuple(k for k in started if k not in now))

    def applied(self, env: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in {**env, **self.set}.items() if k not in self.unset}


def launch_env() -> dict[str, str]:
    """The environment this process was started with (Linux keeps it in ``/proc/self/environ``)."""
    raw = Path("/proc/self/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode(errors="surrogateescape").split("\0") if "=" in entry)


def _child(module: str, request: dict, change: EnvChange, listener: socket.socket, open_conns: list[socket.socket]) -> None:
    """In the forked child: become the process ``python -m MODULE ARGS`` would be."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        listener.close()
        for c in open_conns:
            c.close()
        os.setsid()
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(request["cwd"])
        os.sched_setaffinity(0, request["cores"])
        if request["nice"] > os.getpriority(os.PRIO_PROCESS, 0):  # lowering it would need privileges
            os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(change.applied(request["env"]))
        sys.argv = [module, *request["args"]]
        _title(" ".join([sys.executable, "-m", *sys.argv]))
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _title(title: str) -> None:
    """Name the process as ``ps`` would show it started anew (``setproctitle``, which vLLM installs)."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(title)


def serve(path: Path, module: str, runtime: list[str]) -> None:
    """The zygote: import ``module``, then fork a process running it per request (from a caller whose
    environment differs only in ``runtime`` variables) until the parent is gone."""
    import importlib

    started = launch_env()
    importlib.import_module(module)  # the import every forked child skips
    change = EnvChange.since_start(started)
    parent = os.getppid()
    own = startup_env(started, runtime)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_suffix(".tmp")
    listener.bind(str(tmp))
    listener.listen(8)
    os.replace(tmp, path)  # the socket appears once it accepts
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        if select.select([listener], [], [], 0.2)[0]:
            conn, _ = listener.accept()
            try:
                request, _ = read_line(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            if startup_env(request.get("env", {}), runtime) != own:
                conn.sendall(json.dumps({"refused": "another environment at startup"}).encode() + b"\n")
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(module, request, change, listener, [conn, *children.values()])
            children[pid] = conn
            try:
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            except OSError:  # the caller is gone: its child runs on, reaped below
                pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid not in children:
                continue
            conn = children.pop(pid)
            try:
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:
                pass
            conn.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]))
