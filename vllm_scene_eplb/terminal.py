"""What may reach a terminal: text from a server (or any file) made printable, in one place.

A server's error body or a field it answers can hold escape sequences (``\\x1b]0;title\\x07``,
``\\x1b[2J``) that retitle or clear the terminal, or bidirectional overrides that reorder a line.
Every line the CLI prints goes through ``printable``; long server text is cut by ``shorten``.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, zero-width and bidirectional controls, line separators
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
_NEWLINE = re.compile("[\t\n]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, lines: bool = False) -> str:
    """``text`` with every control character written as its escape (``\\x1b``), so none acts on the
    terminal; ``lines``: keep newlines and tabs (a multi-line view), else escape them too (one line)."""
    text = _CONTROL.sub(_escape, text)
    return text if lines else _NEWLINE.sub(_escape, text)


def shorten(text: str, limit: int = 300) -> str:
    """``text`` cut to about ``limit`` characters, saying how long it was (a 20 KB error page is one line)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
