"""A STAND-IN for CANN's ``acl`` (pyACL), for tests on machines without Ascend NPUs. Not Huawei's.

vLLM-Ascend's NPU worker imports ``acl.rt`` (through its device allocator) at module import; like the
``torch_npu`` stand-in, every ``acl.*`` submodule and attribute is inert (served by that stand-in's
finder). No ACL call does anything: the tests only reach the worker's plain-Python methods.
"""

from __future__ import annotations

import sys

from torch_npu import _StandInModule  # its finder serves the acl.* submodules too

sys.modules[__name__].__class__ = _StandInModule
