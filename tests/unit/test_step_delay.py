"""The test-only step delay (``rig.step_delay``): off without its variable, a bad file refuses
to start, a change is read at the next step, a bad change keeps the last good delay."""

from __future__ import annotations

import os
import time

import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.rig.step_delay import DELAY_ENV, StepDelay, write_delay

pytestmark = pytest.mark.timed  # asserts on time or waits on a tight deadline: the first lane (tests/conftest.py)


def _write(path, text: str, bump: int) -> None:
    path.write_text(text)
    stamp = time.time_ns() + bump * 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


def test_off_unless_its_variable_names_a_file(monkeypatch):
    monkeypatch.delenv(DELAY_ENV, raising=False)
    assert StepDelay.from_env() is None


@pytest.mark.parametrize("text", ["", "ten", "-1", "nan", "1e9"])
def test_a_bad_delay_file_refuses_to_start(tmp_path, monkeypatch, text):
    path = tmp_path / "delay"
    path.write_text(text)
    monkeypatch.setenv(DELAY_ENV, str(path))
    with pytest.raises(SceneEplbError, match=DELAY_ENV):
        StepDelay.from_env()


def test_a_change_is_read_at_the_next_step_and_a_bad_one_keeps_the_last(tmp_path, caplog):
    path = tmp_path / "delay"
    _write(path, "0", 0)
    delay = StepDelay(str(path))
    assert delay.seconds == 0.0
    _write(path, "2.5", 1)
    delay.spend()
    assert delay.seconds == pytest.approx(0.0025)
    _write(path, "garbage", 2)
    delay.spend()
    assert delay.seconds == pytest.approx(0.0025) and "stays 2.5 ms" in caplog.text


def test_a_replaced_file_is_read_even_within_one_mtime_tick(tmp_path):
    """The race that kept a stale delay for a whole A/B arm: a step read the file while it was being
    rewritten, and the write after it kept the same coarse mtime. ``write_delay`` renames a new file
    over the old one, so the reader sees a whole file and a new inode, whatever the clock says."""
    path = tmp_path / "delay"
    write_delay(path, 60.0)
    delay = StepDelay(str(path))
    stamp = os.stat(path).st_mtime_ns
    for ms in (0.0, 60.0, 0.0):
        write_delay(path, ms)
        os.utime(path, ns=(stamp, stamp))  # the same mtime tick as the last value
        delay.spend()
        assert delay.seconds == ms / 1000.0


def test_the_delay_is_spent_on_the_steps_core_not_given_away(tmp_path):
    """A spin, not a sleep: the calling thread's CPU time grows by the delay, as a slower kernel's
    would (a sleep would free the core for the work that shares it)."""
    path = tmp_path / "delay"
    write_delay(path, 30.0)
    delay = StepDelay(str(path))
    cpu, wall = time.thread_time(), time.perf_counter()
    delay.spend()
    assert time.perf_counter() - wall >= 0.030 and time.thread_time() - cpu >= 0.5 * 0.030


def test_the_step_hook_point_is_a_no_op_until_the_rig_installs_the_delay(tmp_path, monkeypatch):
    """The seam: the product calls ``step_hook.run`` in every real step and imports no delay; the
    module vLLM imports as the worker extension (what ``local_server`` names where the variable is
    set) installs the delay's ``spend`` there."""
    import importlib
    import sys

    from vllm_scene_eplb.rig.step_delay import WORKER_EXTENSION
    from vllm_scene_eplb.runtime.worker import step_hook

    step_hook.run()  # nothing installed: nothing happens
    path = tmp_path / "delay"
    write_delay(path, 20.0)
    monkeypatch.setenv(DELAY_ENV, str(path))
    module, name = WORKER_EXTENSION.rsplit(".", 1)
    sys.modules.pop(module, None)
    try:
        assert isinstance(getattr(importlib.import_module(module), name), type)
        wall = time.perf_counter()
        step_hook.run()
        assert time.perf_counter() - wall >= 0.020
    finally:
        step_hook.install(None)
        sys.modules.pop(module, None)
