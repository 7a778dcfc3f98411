"""The vLLM-Ascend 0.23 / vLLM 0.23 functions the recorder wraps. Each wrapper asks
``worker_plugin.current()`` what to do, so with the flag off (the null plugin) every one passes through:

- ``NPUModelRunner.load_model``: configure before the model loads, bind after;
- ``NPUModelRunner.execute_model``: the step boundary, where the observer commits a real pass, but
  only when a forward ran in it: a step with nothing scheduled returns (``kv_connector_no_forward``
  on a P/D node) before any forward, and vLLM's DP loop then runs ``execute_dummy_batch``, whose
  ``_dummy_run`` is this engine's one pass of the lockstep iteration. Where a drafter's MoE layers
  are counted, a step whose ``execute_model`` returns None (its sampling follows) ends after
  ``sample_tokens`` instead, which runs the drafter's passes (``propose_draft_token_ids``): they
  are that step's;
- ``NPUModelRunner._dummy_run``: profile, capture, warm-up and idle-DP passes, dropped (a step each);
- ``NPUModelRunner._determine_batch_execution_and_padding``: called once by every forward, real or
  dummy (never by a drafter): it marks that a forward began and hands the step's DP signature to the
  observer (``agreed_dp_tokens``: what every DP engine agrees on, whatever its graph mode);
- ``WorkerBase.scene_eplb_control``: the worker side of the routes (reached by collective_rpc);
- the API server's ``build_app`` / ``init_app_state``: the routes (``routes``), since vLLM 0.23
  has no endpoint plugins.

The model runner module drags in NPU-only code, so it is wrapped when it is first imported (in the
worker processes), never imported here: ``when_imported``.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable

from . import worker_plugin

MODEL_RUNNER_MODULE = "vllm_ascend.worker.model_runner_v1"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


FORWARD_ATTR = "_scene_eplb_forward_begun"  # on the runner: a forward began in the step being run
SAMPLING_ATTR = "_scene_eplb_step_to_end"  # on the runner: the step ends after sample_tokens (is_dummy)


def agreed_dp_tokens(across_dp) -> list[int]:
    """The step's DP signature: the largest DP rank's (padded) tokens, once per DP rank. Each rank
    decides DP padding from its own graph mode before the sync, so a graph rank gets ``[max] * dp``
    and an eager one the raw vector: the vector differs between ranks, its maximum does not."""
    return [int(across_dp.max())] * len(across_dp)


def _end_sampled_step(runner) -> None:
    """End the step whose end waits for ``sample_tokens`` (none waiting: nothing)."""
    if SAMPLING_ATTR in runner.__dict__:
        worker_plugin.current().end_step(is_dummy=runner.__dict__.pop(SAMPLING_ATTR))


def wrap_model_runner(runner_cls, engine: str) -> None:
    """Configure/bind around ``load_model``; a step ends after ``execute_model`` only where a forward
    ran in it (after ``sample_tokens`` where that runs the counted drafter), and after every
    ``_dummy_run``; each forward's DP metadata gives its DP signature."""
    load, execute, dummy = runner_cls.load_model, runner_cls.execute_model, runner_cls._dummy_run
    sample = getattr(runner_cls, "sample_tokens", None)
    batch = runner_cls._determine_batch_execution_and_padding

    @functools.wraps(load)
    def load_model(self, *args, **kwargs):
        rt = worker_plugin.configure(self.vllm_config, engine)
        out = load(self, *args, **kwargs)
        rt.bind(self)
        return out

    @functools.wraps(execute)
    def execute_model(self, scheduler_output, *args, **kwargs):
        _end_sampled_step(self)  # a step whose sampling never came ends before the next begins
        tokens = scheduler_output.total_num_scheduled_tokens
        rt = worker_plugin.current()
        rt.begin_step(tokens)
        self.__dict__[FORWARD_ATTR] = False
        out = execute(self, scheduler_output, *args, **kwargs)
        if self.__dict__.pop(FORWARD_ATTR, False):  # no forward (nothing scheduled): the dummy batch is the step
            if out is None and sample is not None and getattr(rt, "drafter_observer", None) is not None:
                self.__dict__[SAMPLING_ATTR] = tokens == 0  # the drafter runs in sample_tokens: its passes are this step's
            else:
                rt.end_step(is_dummy=tokens == 0)
        return out

    @functools.wraps(dummy)
    def _dummy_run(self, *args, **kwargs):
        try:
            return dummy(self, *args, **kwargs)
        finally:
            self.__dict__[FORWARD_ATTR] = False  # its step ends here, not again in an enclosing execute_model
            worker_plugin.current().end_step(is_dummy=True)

    @functools.wraps(batch)
    def determine_batch(self, *args, **kwargs):
        out = batch(self, *args, **kwargs)
        self.__dict__[FORWARD_ATTR] = True
        if out[3] is not None:  # num_tokens_across_dp: None without DP
            worker_plugin.current().note_dp_tokens(agreed_dp_tokens(out[3]))
        return out

    runner_cls.load_model, runner_cls.execute_model, runner_cls._dummy_run = load_model, execute_model, _dummy_run
    if sample is not None:

        @functools.wraps(sample)
        def sample_tokens(self, *args, **kwargs):
            try:
                return sample(self, *args, **kwargs)
            finally:
                _end_sampled_step(self)

        runner_cls.sample_tokens = sample_tokens
    runner_cls._determine_batch_execution_and_padding = determine_batch


def control(worker, action: str, *args) -> dict:
    """Worker side of the HTTP routes (``WorkerBase.scene_eplb_control``, reached by collective_rpc)."""
    return worker_plugin.current().control(action, *args)


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``patch(module)`` right after module ``name`` is first executed."""

    def __init__(self, name: str, patch: Callable):
        self.name, self.patch = name, patch
        self._spec: importlib.machinery.ModuleSpec | None = None

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self._spec is not None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._spec = spec
        return importlib.util.spec_from_loader(
            fullname, self, origin=spec.origin, is_package=spec.submodule_search_locations is not None
        )

    def _found(self) -> tuple[importlib.machinery.ModuleSpec, importlib.abc.Loader]:
        """The real module's spec and loader (find_spec set them before the import system calls on)."""
        assert self._spec is not None and self._spec.loader is not None, "find_spec runs first"
        return self._spec, self._spec.loader

    def create_module(self, spec):
        found, loader = self._found()
        return loader.create_module(found)

    def exec_module(self, module):
        found, loader = self._found()
        module.__spec__, module.__loader__ = found, loader
        if found.origin:
            module.__file__ = found.origin
        loader.exec_module(module)
        sys.meta_path.remove(self)
        self.patch(module)


def when_imported(name: str, patch: Callable) -> None:
    """``patch(module)`` now if ``name`` is loaded, else right after its first import."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, patch))


def _api_servers() -> list:
    """The API server module, also when it runs as ``python -m`` (then it is ``__main__``)."""
    found = [sys.modules[API_SERVER_MODULE]] if API_SERVER_MODULE in sys.modules else []
    main = sys.modules.get("__main__")
    if main is not None and getattr(getattr(main, "__spec__", None), "name", None) == API_SERVER_MODULE:
        found.append(main)
    return found


def install(ascend_version: str, vllm_version: str) -> None:
    """Wrap the functions above (idle until a worker's config sets the flag)."""
    from vllm.v1.worker.worker_base import WorkerBase

    from .routes import attach_to_api_server

    engine = f"vllm-ascend {ascend_version} (vllm {vllm_version})"
    when_imported(MODEL_RUNNER_MODULE, lambda mod: wrap_model_runner(mod.NPUModelRunner, engine))
    WorkerBase.scene_eplb_control = control
    for module in _api_servers():
        attach_to_api_server(module, (ascend_version, vllm_version))
