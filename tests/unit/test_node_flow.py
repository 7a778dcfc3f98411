"""The node's flow (``runtime.server.node_flow``, ``protocol.FlowView``): rates over the window, means and
shares per engine step, the window trimmed, and the wire object read back or refused."""

from __future__ import annotations

import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.protocol import FlowView, StatusAnswer
from vllm_scene_eplb.runtime.server.node_flow import FlowStep, NodeFlow

from .test_bad_answers import status


def _flow() -> NodeFlow:
    flow = NodeFlow(max_num_seqs=4, window_s=10.0, started=0.0)
    flow.observe(FlowStep(1.0, running=1, waiting=2, kv_fetching=0, prompt_computed=300, first_token_s=(0.5,)))
    flow.observe(FlowStep(2.0, running=4, waiting=0, kv_fetching=0, generated=4))
    flow.observe(FlowStep(3.0, running=2, waiting=0, kv_fetching=0, generated=2, first_token_s=(0.1, 0.3), finished=2))
    flow.observe(FlowStep(4.0, running=2, waiting=0, kv_fetching=1, generated=2))
    return flow


def test_rates_are_over_the_windows_wall_time_and_means_per_step():
    flow = _flow()
    flow.observe_busy(2.0, 0.5, 2.0)
    flow.observe_busy(4.0, 1.5, 2.0)
    view = flow.view(now=5.0)
    assert view.window_s == 5.0 and view.steps == 4
    assert view.prefill_completions_per_s == pytest.approx(3 / 5)
    assert view.prefilled_tokens_per_s == pytest.approx(300 / 5)
    assert view.generated_tokens_per_s == pytest.approx(8 / 5)
    assert view.finished_per_s == pytest.approx(2 / 5)
    assert view.waiting_mean == pytest.approx(0.5) and view.running_mean == pytest.approx(2.25)
    assert (view.waiting_now, view.running_now) == (0, 2)
    assert view.first_token_ms == pytest.approx(300.0)
    # short of work: below max_num_seqs, nothing waiting and no KV pull pending (only the third step)
    assert view.short_steps_share == pytest.approx(0.25)
    assert view.batch_share == pytest.approx(2.25 / 4)
    assert view.busy_share == 0.5  # step seconds over the live windows' wall seconds


def test_old_steps_leave_the_window():
    flow = _flow()
    flow.observe_busy(2.0, 0.5, 2.0)
    flow.observe_busy(12.0, 0.0, 2.0)
    view = flow.view(now=12.5)
    assert view.steps == 2 and view.window_s == 10.0
    assert view.prefill_completions_per_s == pytest.approx(2 / 10)
    flow.observe_busy(14.0, 0.0, 2.0)
    assert flow.view(now=14.5).busy_share == 0.0  # its steps gone too, the node was idle in every window left


def test_a_window_still_open_is_not_an_idle_one():
    """Steps that no ended live window holds (their window still open, or its calls failing on a slow
    host) leave the busy share unknown; idle windows that ended before them do not make it 0."""
    flow = NodeFlow(max_num_seqs=4, window_s=60.0, started=0.0)
    flow.observe_busy(1.0, 0.0, 1.0)
    flow.observe_busy(2.0, 0.0, 1.0)  # idle windows
    flow.observe(FlowStep(2.5, running=1, waiting=0, kv_fetching=0, prompt_computed=40, first_token_s=(0.2,)))
    assert flow.view(now=2.8).busy_share is None  # the window holding the step has not ended
    assert flow.view(now=2.8).prefill_completions_per_s > 0  # the steps themselves count at once
    flow.observe_busy(5.0, 0.6, 3.0)  # the window [2, 5] that held it, after calls that took long
    assert flow.view(now=5.5).busy_share == pytest.approx(0.6 / 5.0)
    assert NodeFlow(max_num_seqs=4, started=0.0).view(now=1.0).busy_share is None  # no window ended yet


def test_an_empty_window_has_nothing_to_average():
    view = NodeFlow(max_num_seqs=8, started=0.0).view(now=3.0)
    assert view.steps == 0 and view.first_token_ms is None and view.short_steps_share is None


def test_the_flow_reads_back_and_rides_the_status_answer():
    view = _flow().view(now=5.0)
    assert FlowView.from_wire(view.to_wire()) == view
    saved_before = {k: v for k, v in status().items() if k != "flow"}
    assert StatusAnswer.from_wire(saved_before).flow is None  # a status saved before the flow existed
    doc = {**saved_before, "flow": view.to_wire()}
    assert StatusAnswer.from_wire(doc).flow == view and StatusAnswer.from_wire(doc).to_wire() == doc


@pytest.mark.parametrize(
    "change, message",
    [
        ({"running_now": 9}, "max_num_seqs"),
        ({"busy_share": 1.5}, "busy_share"),
        ({"steps": -1}, "steps"),
        ({"first_token_ms": float("nan")}, "first_token_ms"),
    ],
)
def test_a_bad_flow_is_refused_naming_the_field(change, message):
    doc = {**_flow().view(now=5.0).to_wire(), **change}
    with pytest.raises(SceneEplbError, match=message):
        FlowView.from_wire(doc)
