"""How long the stepping thread waited on a CPU run queue: the contention a wall clock cannot see.

On a CPU server the ranks share the machine's cores with the API server, the engine core and the
client; time a rank is runnable but not running stretches its step as a slower MoE would, and moves
with the layout (a cold rank that spins at a barrier absorbs it, a balanced layout puts it on the
critical path). Linux says it per thread: ``/proc/thread-self/schedstat`` is three numbers, the
nanoseconds on a CPU, the nanoseconds waiting on a run queue, and the timeslices run. ``RunQueueWait``
opens it once per thread and re-reads it with one ``pread`` of a few bytes (about 2 us); a missing
file, a kernel without schedstats or any read error makes it say None from then on, and never raises
into the engine.
"""

from __future__ import annotations

import os
import threading

SCHEDSTAT = "/proc/thread-self/schedstat"


def parse_wait_ns(line: bytes | str) -> int | None:
    """The run-queue wait (ns) of a schedstat line: its second field; None for a line that is not one."""
    fields = line.split()
    if len(fields) < 2:
        return None
    try:
        wait = int(fields[1])
    except ValueError:
        return None
    return wait if wait >= 0 else None


class RunQueueWait:
    """The calling thread's cumulative run-queue wait in seconds (``read``), from ``path`` opened once
    per thread (a ``/proc/thread-self`` file names the thread that opened it); None once unreadable."""

    def __init__(self, path: str = SCHEDSTAT):
        self.path = path
        self._fd: int | None = None
        self._thread: int | None = None
        self.broken = False

    def read(self) -> float | None:
        """Seconds this thread has waited on a run queue since it started; None where not readable."""
        if self.broken:
            return None
        try:
            fd = self._fd
            if fd is None or self._thread != threading.get_ident():
                self.close()
                fd = self._fd = os.open(self.path, os.O_RDONLY)
                self._thread = threading.get_ident()
            wait = parse_wait_ns(os.pread(fd, 128, 0))
        except OSError:
            wait = None
        if wait is None:
            self.broken = True
            self.close()
            return None
        return wait * 1e-9

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = self._thread = None
