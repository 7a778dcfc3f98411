"""Every offline `scene-eplb` command the README and docs/ show runs as written, with the files the
repository ships: each page's commands in the order the page shows them, in a folder that holds a copy
of ``data/`` (the same relative paths as the repository root, so that outputs one command writes feed
the next and nothing lands in the checkout). A generator of the rig shown in a code block
(``python -m vllm_scene_eplb.rig.tiny_...``: a small model to try a command on) runs there too.

A command that needs a running server is not run here (the engine tests drive those): one with
``--url``, one of the server commands (``record``, ``audit``, ``watch``, ``bench``), and every command
of a code block that starts a server (``api_server`` or ``vllm serve``), since its files come from
that server (or from a demo that starts servers). Every other command must exit 0, or 1 where 1 is the command's verdict (``advise``,
``pair-advise``: skip or insufficient evidence)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "deploy").rglob("README.md"))]
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
INLINE = re.compile(r"`(scene-eplb [^`]+)`")
SERVER_COMMANDS = {"record", "audit", "watch", "bench"}
SERVER_BLOCK = re.compile(r"api_server|vllm serve|_server\.sh|rig\.demo|demo\.sh|make_examples\.sh")
GENERATOR = re.compile(r"^python -m (vllm_scene_eplb\.rig\.tiny_\w+) ")
VERDICT_EXIT = {"advise": {0, 1}, "pair-advise": {0, 1}}


@dataclass(frozen=True)
class Shown:
    """One `scene-eplb` command as a page shows it: where, the line, and whether it needs a server."""

    page: str
    at: int
    line: str
    server: bool


def shown_commands(page: Path) -> list[Shown]:
    """A page's commands in page order: code-block lines (continuations joined, comments cut) and inline code."""
    text, name = page.read_text(), page.relative_to(REPO).as_posix()
    found: list[Shown] = []
    for block in FENCE.finditer(text):
        server_block = bool(SERVER_BLOCK.search(block.group(1)))
        for line in block.group(1).replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].strip()
            if line.startswith("scene-eplb ") or GENERATOR.match(line):
                found.append(Shown(name, block.start(), line, server_block or _needs_server(line)))
    prose = FENCE.sub(lambda m: " " * len(m.group(0)), text)  # same offsets, no code blocks
    found += [Shown(name, m.start(), m.group(1), _needs_server(m.group(1))) for m in INLINE.finditer(prose)]
    return sorted(found, key=lambda s: s.at)


def _needs_server(line: str) -> bool:
    if GENERATOR.match(line):
        return False
    words = shlex.split(line)
    return "--url" in words or (len(words) > 1 and words[1] in SERVER_COMMANDS) or "http://" in line


def _runnable(shown: Shown) -> bool:
    words = shlex.split(shown.line)
    return not shown.server and len(words) > 2 and "--help" not in words and "-h" not in words


RUNS = {page.relative_to(REPO).as_posix(): [s for s in shown_commands(page) if _runnable(s)] for page in PAGES}


def test_the_pages_show_offline_commands_to_run():
    assert sum(map(len, RUNS.values())) >= 20 and RUNS["README.md"] and RUNS["docs/cli.md"]


@pytest.mark.parametrize("page", [p for p, runs in RUNS.items() if runs])
def test_every_offline_command_runs_as_written(page, tmp_path):
    shutil.copytree(REPO / "data", tmp_path / "data")
    failed = []
    for shown in RUNS[page]:
        words = shlex.split(shown.line)
        command = words[2:] if GENERATOR.match(shown.line) else ["vllm_scene_eplb.cli", *words[1:]]
        done = subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        if done.returncode not in VERDICT_EXIT.get(words[1], {0}):
            failed.append(f"`{shown.line}` exit {done.returncode}: {done.stderr.strip()[-400:]}")
    assert not failed, "\n".join(failed)


def test_a_command_that_fails_is_caught(tmp_path):
    """The runner's own yardstick: a placeholder file name fails the way a broken doc line would."""
    done = subprocess.run(
        [sys.executable, "-m", "vllm_scene_eplb.cli", "inspect", "counts.npz"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 2 and "counts.npz" in done.stderr
