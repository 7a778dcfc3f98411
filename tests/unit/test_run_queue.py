"""Contention seen, not assumed (issue 37, item 3): on CPU each rank reads its stepping thread's
run-queue wait (``/proc/thread-self/schedstat``, second field) at step begin and end beside the wall
clock; the window carries the largest rank's share of its step time (``wait_share``), and ``advise``
abstains above ``MAX_WAIT_SHARE``. The reader is cheap, and never raises into the engine."""

import os
import threading
import time

import numpy as np
import pytest

from vllm_scene_eplb.live.measured import RankTime, time_view
from vllm_scene_eplb.runtime.worker import moe_timing
from vllm_scene_eplb.runtime.worker.observer import RoutingObserver
from vllm_scene_eplb.runtime.worker.run_queue import SCHEDSTAT, RunQueueWait, parse_wait_ns

pytestmark = pytest.mark.timed  # asserts on time or waits on a tight deadline: the first lane (tests/conftest.py)


def test_the_reader_takes_the_second_field_of_a_schedstat_line_and_nothing_else():
    assert parse_wait_ns(b"116563 3249188 2\n") == 3249188
    assert parse_wait_ns("5 0 1") == 0
    for bad in (b"", b"116563\n", b"1 two 3", b"1 -4 3"):
        assert parse_wait_ns(bad) is None, bad


def test_a_missing_or_unreadable_file_reads_none_from_then_on_and_never_raises(tmp_path):
    reader = RunQueueWait(str(tmp_path / "no-such-schedstat"))
    assert reader.read() is None and reader.broken and reader.read() is None
    bad = tmp_path / "schedstat"
    bad.write_text("not a schedstat line\n")
    assert RunQueueWait(str(bad)).read() is None
    good = tmp_path / "good"
    good.write_text("10 2500000000 3\n")
    assert RunQueueWait(str(good)).read() == pytest.approx(2.5)


def test_the_reader_opens_its_file_once_per_thread(tmp_path):
    path = tmp_path / "schedstat"
    path.write_text("10 1000 3\n")
    reader = RunQueueWait(str(path))
    assert reader.read() == pytest.approx(1e-6)
    fd = reader._fd
    path.write_text("10 3000 3\n")  # the same file re-read in place (pread): no new open
    assert reader.read() == pytest.approx(3e-6) and reader._fd == fd
    other = []
    thread = threading.Thread(target=lambda: other.append(reader.read()))
    thread.start()
    thread.join()
    assert other == [pytest.approx(3e-6)] and reader._thread != threading.get_ident()  # reopened for that thread
    reader.close()


@pytest.mark.skipif(not os.path.exists(SCHEDSTAT) or not hasattr(os, "sched_setaffinity"), reason="no schedstat here")
def test_a_busy_thread_sharing_its_core_with_another_waits_on_the_run_queue():
    """Where the machine allows (schedstats on, affinity settable): two spinning threads on one core
    each wait about half the time; the assertion is only that the wait grew."""
    core = min(os.sched_getaffinity(0))
    waits: list[float | None] = []

    def spin(record: bool) -> None:
        os.sched_setaffinity(0, {core})  # this thread only
        reader = RunQueueWait()
        start, until = reader.read(), time.perf_counter() + 0.1
        while time.perf_counter() < until:
            pass
        end = reader.read()
        if record:
            waits.append(None if start is None or end is None else end - start)

    threads = [threading.Thread(target=spin, args=(i == 0,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if waits == [None]:
        pytest.skip("this kernel does not say the run-queue wait")
    assert waits[0] is not None and waits[0] > 0, waits


class ScriptedWait(RunQueueWait):
    """A reader whose readings are given (seconds), in order; None breaks it as a failed read would."""

    def __init__(self, readings):
        super().__init__("/nonexistent")
        self.readings = iter(readings)

    def read(self):
        value = next(self.readings)
        if value is None:
            self.broken = True
        return None if self.broken else value


def test_the_wait_inside_real_steps_is_summed_beside_their_wall_time(monkeypatch):
    clock = iter([0.0, 0.1, 0.15, 0.25, 0.3, 0.5, 0.6])
    monkeypatch.setattr(moe_timing.time, "perf_counter", lambda: next(clock))
    obs = RoutingObserver(1, 2, 2, time_moe=True)
    obs.timing.wait = ScriptedWait([1.0, 1.02, 2.0, 2.5, 2.51])  # read at each start, and at a real step's end
    for dummy in (False, True, False):  # the dummy step's wait (2.0 -> 2.5) is not a real step's
        obs.begin_step(1)
        obs.add_moe_seconds(0, 0.01)
        obs.end_step(dummy)
    live = obs.live_counts()
    assert live.steps == 2 and live.step_seconds == pytest.approx(0.3)
    assert live.wait_seconds == pytest.approx(0.03)
    obs.timing.wait = ScriptedWait([None])
    obs.begin_step(1)
    assert obs.live_counts().wait_seconds is None  # a reader that failed once says nothing from then on
    assert RoutingObserver(1, 2, 2).live_counts().wait_seconds is None  # time_moe off: nothing read


def test_a_cpu_observer_reads_the_run_queue_and_a_device_one_does_not():
    assert isinstance(RoutingObserver(1, 2, 2, time_moe=True).timing.wait, RunQueueWait)
    assert RoutingObserver(1, 2, 2, time_moe=False).timing.wait is None
    assert RoutingObserver(1, 2, 2, device="meta", time_moe=True).timing.wait is None


def _rank(wait: float | None, step_seconds: float = 2.0) -> RankTime:
    return RankTime(np.array([0.2, 0.1]), 10, 10, step_seconds, 0.3, wait_seconds=wait)


def test_the_window_says_the_largest_ranks_wait_share_or_none():
    assert time_view([_rank(0.02), _rank(0.2)]).wait_share == pytest.approx(0.1)
    assert time_view([_rank(0.02), _rank(None)]).wait_share is None  # a rank that did not read it
    assert time_view([_rank(3.0)]).wait_share == 1.0  # clipped: a wait longer than its step is the clocks' skew
    assert _rank(0.5).since(_rank(0.2)).wait_seconds == pytest.approx(0.3)
    assert _rank(0.5).since(_rank(None)).wait_seconds is None


def test_the_kernel_clock_is_the_threads_cpu_time_on_cpu_and_the_wall_clock_elsewhere():
    """A CPU timer that sleeps 50 ms advances by about nothing (no kernel ran); a device's is the wall clock."""
    cpu, device = moe_timing.MoeTiming(1, on=True, cpu=True), moe_timing.MoeTiming(1, on=True)
    c0, d0 = cpu.kernel_clock(), device.kernel_clock()
    time.sleep(0.05)
    assert cpu.kernel_clock() - c0 < 0.01 and device.kernel_clock() - d0 >= 0.05
    assert RoutingObserver(1, 2, 2, time_moe=True).timing.cpu and not RoutingObserver(1, 2, 2, device="meta").timing.cpu


def _spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity here")
def test_a_kernel_sharing_its_core_is_timed_by_the_time_it_ran_not_by_the_wall_clock():
    """This process and a forked one spinning on one core (processes: no GIL between them): over 0.2 s
    of wall clock, the kernel clock advances by about the half this one ran."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        child = os.fork()
        if child == 0:
            _spin(0.4)
            os._exit(0)
        timing = moe_timing.MoeTiming(1, on=True, cpu=True)
        _spin(0.02)  # the child is running beside it by now
        k0, w0 = timing.kernel_clock(), time.perf_counter()
        _spin(0.2)
        kernel, wall = timing.kernel_clock() - k0, time.perf_counter() - w0
        os.waitpid(child, 0)
    finally:
        os.sched_setaffinity(0, before)
    assert 0 < kernel < 0.8 * wall, (kernel, wall)
