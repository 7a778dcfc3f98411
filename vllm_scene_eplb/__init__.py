"""Scene-specific static expert-parallel load balancing (EPLB) for vLLM and vLLM-Ascend.

One folder per stage of the workflow, each importing only its own folder and the rows below it
(docs/code-layout.md; tests/repository/test_house.py checks every import). The pure core is numpy
and the standard library, no torch, no inference engine: the shared utilities here (``arrays``,
``fileio``, ``errors``, ``terminal``), ``protocol/`` (the wire contract), ``layouts/`` (counts,
layout, dispatch, score, evaluation, scenes, report), ``planning/`` (model geometry, memory,
sizing, step cost), ``formats/``, ``fit/``, ``live/`` (live fitness, measured traffic),
``advise/``, ``hash_layers/`` (DeepSeek-V4's hash layers counted from tokens), ``client/`` (the
clients of a running server), ``ab/`` (the A/B harness, but ``bench``), ``commands/`` and ``cli``.
Engine-neutral runtime code is in ``runtime/`` (``worker/`` and ``server/`` by process, ``config``
at its top), the engine code in ``adapters/``, the engine test rig and the demo in ``rig/``.
See docs/glossary.md for the words.
"""

__version__ = "0.1.0"
