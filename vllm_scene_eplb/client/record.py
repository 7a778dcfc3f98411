"""HTTP client for a server's recorder routes (stdlib only): start, stop, dump, status."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from ..errors import SceneEplbError
from ..protocol import ACTIONS, KEEP_SKIPPED, ROUTE_BY_ACTION


def call(url: str, action: str, api_key: str | None = None, timeout: float = 300.0, keep_skipped: bool = False) -> dict:
    """Send ``action`` to the server at ``url``; returns its JSON answer, raises SceneEplbError on any error.
    ``keep_skipped`` (dump only): write a record with skipped passes anyway."""
    if action not in ROUTE_BY_ACTION:
        raise SceneEplbError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
    if not url.startswith(("http://", "https://")):
        raise SceneEplbError(f"--url {url!r}: expected a server base URL such as http://host:8000")
    route = ROUTE_BY_ACTION[action]
    target = url.rstrip("/") + route.path + (f"?{KEEP_SKIPPED}=true" if keep_skipped else "")
    try:
        req = urllib.request.Request(target, method=route.method, data=None if route.method == "GET" else b"")
        if api_key:
            req.add_header("Authorization", f"Bearer {api_key}")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read().decode() or "{}")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        try:
            detail = json.loads(body).get("error") or json.loads(body).get("detail") or body
        except (json.JSONDecodeError, AttributeError):
            detail = body or exc.reason
        hint = (
            " (is the server started with VLLM_PLUGINS=scene_eplb?)"
            if exc.code == 404 and "not enabled" not in str(detail)
            else ""
        )
        raise SceneEplbError(f"{action}: HTTP {exc.code}: {detail}{hint}", target) from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SceneEplbError(f"{action}: the server's answer is not JSON", target) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: a malformed URL
        raise SceneEplbError(f"{action}: cannot reach the server: {getattr(exc, 'reason', exc)}", target) from None
