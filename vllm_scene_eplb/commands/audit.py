"""`scene-eplb audit`: check that a running server loaded the intended layout, dispatch and recorder state."""

from __future__ import annotations

from ..client.record import answer
from ..client.server_audit import audit_server, status_from_log
from ..errors import SceneEplbError
from ..layouts.dispatch import DISPATCH_ALGORITHMS
from ..protocol import OBSERVER_IDLE, OBSERVER_OFF, OBSERVER_RECORDING, StartupLine, StatusAnswer
from .arguments import server_args
from .console import Console

HELP = "check a running server loaded the intended layout, dispatch and recorder state"
DESCRIPTION = (
    "Read the server's status route (and optionally its log's startup lines) and check: layout hash equals the "
    "intended file's, redundant slots and dispatch algorithm as intended, recorder state. Exit 0 when every "
    "check passes, 1 when one fails, 2 on an error."
)


def add_arguments(p) -> None:
    server_args(
        p,
        url_default=None,
        url_help="server base URL (its status route); omit it and give --log alone where the plugin has no routes (vLLM-Ascend)",
    )
    p.add_argument("--layout", help="the intended layout file (omit for a server that must run the linear layout)")
    p.add_argument("--dispatch", choices=DISPATCH_ALGORITHMS, help="the intended dispatch algorithm")
    p.add_argument(
        "--recorder",
        choices=(OBSERVER_OFF, OBSERVER_IDLE, OBSERVER_RECORDING),
        default=OBSERVER_IDLE,
        help="intended recorder state (default idle: armed but not recording, right for a measurement run)",
    )
    p.add_argument(
        "--log",
        help="the server log: every worker's startup line must agree with the status route "
        "(without --url: with the first worker's line, which stands in for the route)",
    )


def run(args, console: Console) -> None:
    status: StatusAnswer | StartupLine
    if args.url:
        status = answer(args.url, "status", args.api_key)
    elif args.log:
        status = status_from_log(args.log)
    else:
        raise SceneEplbError("audit needs --url (the status route) or --log (the server log's startup lines)")
    checks = audit_server(status, args.layout, args.dispatch, args.recorder, args.log)
    ok = all(c.ok for c in checks)
    text = "\n".join(f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in checks)
    console.emit(
        {"ok": ok, "checks": [c.__dict__ for c in checks], "status": status.to_wire()},
        text + f"\naudit: {'PASS' if ok else 'FAIL'}",
    )
    if not ok:
        raise SystemExit(1)
