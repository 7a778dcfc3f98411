"""A STAND-IN for ``torch_npu``, for tests on machines without Ascend NPUs. Not Huawei's torch_npu.

``torch_npu`` links Huawei's CANN libraries, which no package registry ships, so it cannot be
imported here. vLLM-Ascend imports it (and many ``torch_npu.*`` submodules) at import time; this
package lets its real Python code import and run on CPU:

- every ``torch_npu.*`` submodule resolves to an inert module (a meta-path finder below);
- an attribute starting with a capital letter (``Stream``, ``Event``, ...) is an empty class, so
  annotations and subclassing work; any other attribute is an inert callable whose result is again
  inert and falsy;
- ``torch.npu`` points at ``torch_npu.npu``, whose ``is_available()`` is False and ``device_count()`` 0;
  ``torch.distributed.is_hccl_available()`` is False (torch_npu adds it); torch's privateuse1 backend
  is named ``npu``, as torch_npu names it, so ``torch.device("npu")`` parses (no tensor lives there).

- ``torch.npu.Event`` is ``Event`` below: it keeps the host time of its ``record`` (so
  ``elapsed_time`` is the host time between two records) and logs every call in ``EVENTS.calls``;
  ``Event.synchronize`` and ``torch.npu.synchronize`` fail while ``EVENTS.in_forward`` is set (a
  test sets it around its forward passes), and ``torch.npu.is_current_stream_capturing`` returns
  ``EVENTS.capturing`` (a test sets it to act a graph capture).

- ``torch_npu.npu_format_cast`` returns its tensor: ND and NZ are NPU memory formats, and on CPU every
  tensor is ND (vLLM-Ascend casts MoE and MLA weights after loading them).

No NPU kernel is implemented: a test that reaches one gets an inert object back, and the tests only
drive paths that are plain torch on CPU (``_native_select_experts``, vLLM-Ascend's own Python).
docs/ascend.md says which of vLLM-Ascend's paths ran here against this stand-in.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import time
import types

import torch

FIXED = {
    "torch_npu.npu.is_available": lambda *a, **k: False,
    "torch_npu.npu.device_count": lambda *a, **k: 0,
    "torch_npu.npu_format_cast": lambda tensor, *a, **k: tensor,  # ND / NZ are NPU memory formats: on CPU every tensor is ND
}
_classes: dict[str, type] = {}


class _Inert:
    """A stand-in attribute: callable, indexable by attribute, falsy."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        if self._name in FIXED:
            return FIXED[self._name](*args, **kwargs)
        return _Inert(f"{self._name}()")

    def __getattr__(self, item: str):
        return _attr(f"{self._name}.{item}", item)

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<torch_npu stand-in {self._name}>"


def _attr(name: str, item: str):
    if item.startswith("__"):
        raise AttributeError(item)
    if item[:1].isupper():
        if name not in _classes:
            _classes[name] = type(
                item, (), {"__init__": lambda self, *a, **k: None, "__getattr__": lambda self, i, n=name: _attr(f"{n}().{i}", i)}
            )
        return _classes[name]
    return _Inert(name)


class _StandInModule(types.ModuleType):
    def __getattr__(self, item: str):
        return _attr(f"{self.__name__}.{item}", item)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every ``torch_npu.<sub>`` (and CANN's ``acl.<sub>``, see ``acl``) module as an inert package."""

    def find_spec(self, name, path, target=None):
        if name.startswith(("torch_npu.", "acl.")):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _StandInModule
npu = sys.modules.setdefault("torch_npu.npu", _StandInModule("torch_npu.npu"))
torch.npu = npu

EVENTS = types.SimpleNamespace(calls=[], in_forward=False, capturing=False)


def _no_sync_in_forward(what: str) -> None:
    EVENTS.calls.append(what)
    if EVENTS.in_forward:
        raise AssertionError(f"{what} inside the forward: the host would wait on the NPU")


class Event:
    """A stand-in for ``torch.npu.Event``: host times of its records, every call logged."""

    def __init__(self, enable_timing: bool = False, **kwargs):
        self.enable_timing, self.at = enable_timing, None

    def record(self, stream=None) -> None:
        EVENTS.calls.append("record")
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        _no_sync_in_forward("Event.synchronize")

    def query(self) -> bool:
        EVENTS.calls.append("query")
        return True

    def elapsed_time(self, end: Event) -> float:
        EVENTS.calls.append("elapsed_time")
        if not (self.enable_timing and end.enable_timing) or self.at is None or end.at is None:
            raise RuntimeError("elapsed_time needs two recorded timing events")
        return (end.at - self.at) * 1000.0


npu.Event = Event
npu.synchronize = lambda *a, **k: _no_sync_in_forward("torch.npu.synchronize")
npu.is_current_stream_capturing = lambda: EVENTS.capturing
torch.distributed.is_hccl_available = lambda: False  # torch_npu adds this to torch.distributed
if torch._C._get_privateuse1_backend_name() != "npu":
    torch.utils.rename_privateuse1_backend("npu")  # as torch_npu does: "npu" device strings parse
