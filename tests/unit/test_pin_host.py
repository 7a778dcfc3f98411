"""Host processes off the ranks' cores (issue 37 item 3): ``local_server.pin_host`` moves the caller
and what it starts off the cores the workers bind, only where there are cores to spare."""

from __future__ import annotations

import json
import os

import pytest

from vllm_scene_eplb.rig.local_server import cores_of

from ..conftest import run_script


@pytest.mark.parametrize(("bind", "cores"), [("0|1", {0, 1}), ("0-3|4-7", set(range(8))), ("0,2|1,3", {0, 1, 2, 3}), ("5", {5})])
def test_the_binding_syntax_names_its_cores(bind, cores):
    assert cores_of(bind) == cores


def _probe(*binds: str) -> dict:
    done = run_script("pin_probe", *binds)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_host_moves_off_the_ranks_cores_with_what_it_starts_and_stays_where_none_are_spare():
    allowed = sorted(os.sched_getaffinity(0))
    everything = _probe("|".join(map(str, allowed)))  # the ranks take every core: nothing moves
    assert everything == {"host": [], "self": allowed, "child": allowed}
    if len(allowed) < 2:
        pytest.skip("one core: no binding leaves a core to spare")
    moved = _probe(str(allowed[0]))
    assert moved == {"host": allowed[1:], "self": allowed[1:], "child": allowed[1:]}
