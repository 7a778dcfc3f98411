"""A module run by tests/unit/test_server_zygote.py's zygote as it runs vLLM's API server: its work
under ``__main__`` (the zygote imports it first). Prints what it sees as one JSON line, then exits with
the code its first argument names, or sleeps first where it is ``sleep``."""

from __future__ import annotations

import json
import os
import sys
import time

import zygote_dep  # noqa: F401  # sets a variable as it is imported, once

if __name__ == "__main__":
    mask = os.umask(0)
    os.umask(mask)
    seen = {"argv": sys.argv[1:], "cwd": os.getcwd(), "mark": os.environ.get("ZYGOTE_MARK"), "umask": mask}
    seen["set_at_import"] = os.environ.get("SET_AT_IMPORT")
    print(json.dumps({**seen, "sid": os.getsid(0), "pid": os.getpid()}), flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(60)
    sys.exit(0 if sys.argv[1] == "sleep" else int(sys.argv[1]))
