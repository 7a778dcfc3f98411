"""The one HTTP client of the CLI (stdlib only): a JSON answer, or one ``ServerError`` line naming the
URL and what came back. It cannot crash on a server that misbehaves: a reply that is not HTTP, a
body cut short, a dropped connection, a timeout, a body that is not JSON (NaN included) or is nested
beyond what Python can decode, an answer larger than ``MAX_ANSWER_BYTES``; error bodies come back
shortened and printable."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from ..errors import SceneEplbError
from ..terminal import printable, shorten

MAX_ANSWER_BYTES = 1 << 28  # 256 MiB: far above any answer (a native load is [L, E] integers)


class ServerError(SceneEplbError):
    """A request that got no usable answer; ``status`` is the HTTP status when one came back."""

    def __init__(self, problem: str, url: str, status: int | None = None):
        super().__init__(problem, url)
        self.status = status


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def decode_json(body: bytes) -> Any:
    """Strict JSON (no NaN or Infinity) from a body, ValueError when it is none."""
    try:
        return json.loads(body.decode(), parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None


def _error_detail(body: bytes, reason: str) -> str:
    """What an error answer says: its JSON ``error`` or ``detail``, else its text, else the reason."""
    try:
        doc = decode_json(body)
        detail = doc.get("error") or doc.get("detail") if isinstance(doc, dict) else None
    except ValueError:
        detail = None
    text = detail if isinstance(detail, str) else body.decode(errors="replace")
    return printable(shorten(text or reason or "no body"))


def _got(body: bytes) -> str:
    """A short, printable sample of an answer, for the message that refuses it."""
    return printable(shorten(body.decode(errors="replace"), 80)) or "an empty body"


def _read(resp, url: str, what: str) -> bytes:
    """The whole body, at most MAX_ANSWER_BYTES; IncompleteRead when it is shorter than its Content-Length."""
    too_large = ServerError(f"{what}: the answer is larger than {MAX_ANSWER_BYTES} bytes", url)
    if resp.length is not None:
        if resp.length > MAX_ANSWER_BYTES:
            raise too_large
        return resp.read()
    chunks, size = [], 0
    while chunk := resp.read(1 << 20):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise too_large
    return b"".join(chunks)


def request_json(url: str, method: str = "GET", api_key: str | None = None, timeout: float = 30.0, what: str = "request") -> Any:
    """``method url`` with an optional bearer key; the decoded JSON answer. Every failure is a
    ServerError: ``what`` (the action) and the problem, with ``url`` as its place."""
    if not url.startswith(("http://", "https://")):
        raise ServerError(f"{what}: expected a server URL such as http://host:8000", url)
    try:
        req = urllib.request.Request(url, method=method, data=None if method == "GET" else b"")
        if api_key:
            req.add_header("Authorization", f"Bearer {api_key}")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = _read(resp, url, what)
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read(4096)
        except (http.client.HTTPException, OSError):
            body = b""
        raise ServerError(f"{what}: HTTP {exc.code}: {_error_detail(body, str(exc.reason))}", url, exc.code) from None
    except http.client.IncompleteRead as exc:
        raise ServerError(f"{what}: the answer was cut short ({len(exc.partial)} bytes of its announced length)", url) from None
    except http.client.RemoteDisconnected:
        raise ServerError(f"{what}: the server closed the connection without an answer", url) from None
    except http.client.HTTPException as exc:  # BadStatusLine, RemoteDisconnected, LineTooLong, ...
        raise ServerError(
            f"{what}: the server's reply is not HTTP ({type(exc).__name__}: {_got(str(exc).encode())})", url
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, timeout, DNS; ValueError: a malformed URL
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise ServerError(f"{what}: no answer within {timeout:g} s", url) from None
        raise ServerError(
            f"{what}: cannot reach the server: {printable(shorten(str(reason) or type(reason).__name__))}", url
        ) from None
    try:
        return decode_json(body) if body.strip() else {}
    except ValueError as exc:
        raise ServerError(f"{what}: the server's answer is not JSON ({exc}): got {_got(body)}", url) from None
