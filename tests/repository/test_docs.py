"""Docs that stay true: every ``scene-eplb`` command shown in the README and docs/ parses with the
CLI's own parser (nothing runs), and every relative link resolves."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from vllm_scene_eplb.cli import build_parser
from vllm_scene_eplb.commands import COMMANDS

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "deploy").rglob("README.md"))]
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
INLINE = re.compile(r"`(scene-eplb [^`]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _commands(page: Path) -> list[str]:
    """Every ``scene-eplb`` command line of a page: in code blocks (continuation lines joined,
    comments cut) and in inline code."""
    text = page.read_text()
    found = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].strip()
            if line.startswith("scene-eplb "):
                found.append(line)
    found += INLINE.findall(FENCE.sub("", text))
    return found


ALL = [(page.relative_to(REPO).as_posix(), cmd) for page in PAGES for cmd in _commands(page)]


def test_the_pages_show_commands_at_all():
    assert len(ALL) >= 30 and {p for p, _ in ALL} >= {"README.md", "docs/cli.md"}


def _variants(command: str) -> list[list[str]]:
    """The argument lists a shown command stands for: ``start|stop`` is one command per alternative."""
    out: list[list[str]] = [[]]
    for token in shlex.split(command)[1:]:
        choices = token.split("|") if "|" in token and not token.startswith("-") else [token]
        out = [args + [c] for args in out for c in choices]
    return out


@pytest.mark.parametrize("page, command", ALL, ids=[f"{p}:{i}" for i, (p, _) in enumerate(ALL)])
def test_every_command_parses(page, command, capsys):
    """A command with arguments must parse as shown; a bare ``scene-eplb NAME`` in prose must name a command."""
    parser = build_parser()
    if len(shlex.split(command)) == 2 and not shlex.split(command)[1].startswith("-"):
        commands = next(a for a in parser._actions if a.dest == "command").choices
        assert shlex.split(command)[1] in commands, f"{page}: `{command}` names no command"
        return
    for args in _variants(command):
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            if exc.code == 0:  # --help
                continue
            pytest.fail(f"{page}: `{command}` does not parse: {capsys.readouterr().err.strip()} (exit {exc.code})")


def test_a_command_that_does_not_parse_fails():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["fit", "counts.npz", "--no-such-flag"])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"^(https?:|mailto:|#)", target):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, broken


def test_code_layout_names_every_module():
    """docs/code-layout.md matches the tree: every module of the package is named there, but the
    commands (one module per command, listed by `scene-eplb --help`) and the fitter's stages
    (docs/fitter.md names them)."""
    doc = (REPO / "docs" / "code-layout.md").read_text()
    package = REPO / "vllm_scene_eplb"
    missing = [
        str(p.relative_to(REPO))
        for p in sorted(package.rglob("*.py"))
        if p.stem != "__init__"
        and p.parent.name not in ("commands", "fit")
        and not any(f in doc for f in (f"`{p.stem}`", f"`{p.stem}.", f"/{p.stem}.py`"))
    ]
    assert not missing, f"docs/code-layout.md does not name {missing}"


def test_the_cli_page_shows_every_command():
    """docs/cli.md is the one page of every command: each one `scene-eplb --help` lists is shown there."""
    shown = {shlex.split(cmd)[1] for page, cmd in ALL if page == "docs/cli.md"}
    assert not set(COMMANDS) - shown, f"docs/cli.md shows no {sorted(set(COMMANDS) - shown)}"
