"""Imported once by tests/scripts/zygote_child.py: sets a variable as vLLM's modules set
``TORCHINDUCTOR_COMPILE_THREADS`` when they are imported, which a forked child must still see."""

import os

os.environ["SET_AT_IMPORT"] = "yes"
