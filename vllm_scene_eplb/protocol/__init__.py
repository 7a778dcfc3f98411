"""The plugin's wire contract, in one place: route paths, status keys, the startup log line, and
every answer that crosses (worker -> API server -> client) as a typed object with ``from_wire`` /
``to_wire`` side by side, one module per concern:

- ``routes``: the control routes, the worker actions behind them and the keys of their answers;
- ``fields``: the field readers every wire object is read with (one line naming the field at fault);
- ``status``: a worker's status, every rank's view and the startup line;
- ``status_answer``: the status route's answer (EP rank 0's status, every rank's view, their
  agreement, the live object, the node's flow);
- ``live``: the status answer's live object, and the workers' live and record-live answers;
- ``export``: a worker's export job, its dump start and the dump route's answer;
- ``native_load``: a rank's engine counters and the native_load route's sum;
- ``worker_answer``: the worker answer that carries any payload over collective_rpc;
- ``timing``: the timing window ``advise`` prices, with the server it came from;
- ``pass_groups``: a timing window's passes by size (a rank's sums, the window's means);
- ``advice``: what ``advise`` answers;
- ``pair``: what ``pair-advise`` answers;
- ``flow``: a node's flow (P supply, D demand) over its last engine steps.

The workers, the API server (engine adapters, ``runtime``) and the client side (``scene-eplb
record``, ``audit``, ``bench``) all import it from here, so a route, key or field renamed here is
renamed everywhere. Stdlib only.
"""

from .advice import VERDICTS, Advice
from .export import EXPORT_STATES, DumpAnswer, DumpStarted, ExportJobAnswer
from .fields import MAX_WIRE_INT
from .flow import FLOW_KEY, FLOW_SOURCES, FlowView
from .live import DrafterLiveView, LiveAnswer, LiveTime, MeasuredView, PassTimes, RankLiveAnswer, RecordLive
from .native_load import NativeCounts, NativeLoadAnswer, RankNativeLoad
from .pass_groups import GROUPS, PASS_GROUP_TOKENS, PassGroup, RankPassGroups, group_tokens, pass_group
from .routes import (
    ACTIONS,
    AGREE_KEY,
    AGREEMENT_KEYS,
    AUDITED_KEYS,
    DUMP_META_KEYS,
    EXPORT_STATUS_ACTION,
    KEEP_SKIPPED,
    LIVE_ACTION,
    LIVE_KEY,
    LOAD_AUDIT_PASSED,
    LOAD_AUDIT_REFUSED,
    NATIVE_ACTION,
    OBSERVER_IDLE,
    OBSERVER_OFF,
    OBSERVER_RECORDING,
    RANKS_KEY,
    RECORD_LIVE_ACTION,
    ROUTE_BY_ACTION,
    ROUTES,
    Route,
)
from .status import (
    COMM_METHOD_LINE,
    COMM_METHOD_RE,
    RANK_KEYS,
    STATUS_KEYS,
    RankView,
    StartupLine,
    WorkerStatus,
    parse_startup_lines,
    startup_line,
)
from .status_answer import StatusAnswer
from .timing import PROVENANCE_KEYS, TimingWindow
from .worker_answer import WireObject, WorkerAnswer

__all__ = [
    "ACTIONS",
    "AGREEMENT_KEYS",
    "AGREE_KEY",
    "AUDITED_KEYS",
    "Advice",
    "COMM_METHOD_LINE",
    "COMM_METHOD_RE",
    "DUMP_META_KEYS",
    "DumpAnswer",
    "DumpStarted",
    "EXPORT_STATES",
    "EXPORT_STATUS_ACTION",
    "FLOW_KEY",
    "FLOW_SOURCES",
    "GROUPS",
    "FlowView",
    "ExportJobAnswer",
    "KEEP_SKIPPED",
    "LIVE_ACTION",
    "LIVE_KEY",
    "DrafterLiveView",
    "LiveAnswer",
    "LiveTime",
    "MAX_WIRE_INT",
    "MeasuredView",
    "NATIVE_ACTION",
    "NativeCounts",
    "NativeLoadAnswer",
    "LOAD_AUDIT_PASSED",
    "LOAD_AUDIT_REFUSED",
    "OBSERVER_IDLE",
    "OBSERVER_OFF",
    "OBSERVER_RECORDING",
    "PASS_GROUP_TOKENS",
    "PROVENANCE_KEYS",
    "PassGroup",
    "PassTimes",
    "RANKS_KEY",
    "RANK_KEYS",
    "RECORD_LIVE_ACTION",
    "ROUTES",
    "ROUTE_BY_ACTION",
    "RankLiveAnswer",
    "RankNativeLoad",
    "RankPassGroups",
    "RankView",
    "RecordLive",
    "Route",
    "STATUS_KEYS",
    "StartupLine",
    "StatusAnswer",
    "TimingWindow",
    "VERDICTS",
    "WireObject",
    "WorkerAnswer",
    "WorkerStatus",
    "group_tokens",
    "pass_group",
    "parse_startup_lines",
    "startup_line",
]
