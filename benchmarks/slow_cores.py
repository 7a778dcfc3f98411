"""Run a command on this host's cores slowed to 1/FACTOR of their speed: a stand-in for a slower host
of the same core count (the suite read about 1.4x as long on a 2-core AVX2 VM as on this 2-core EPYC).
On each core a spinner at nice -20 takes 1 - 1/FACTOR of its time, in slices of 10 ms, so every
process of the command, one alone or many at once, gets 1/FACTOR of each core. What it cannot slow:
memory, disk and whatever a slower host's instruction set costs beyond its clock. It prints the
slowdown of a CPU-bound loop measured under the spinners, then the command's exit code and wall time.

    python benchmarks/slow_cores.py 1.4 -- env CI=true bash .ci/run
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

PERIOD_S = 0.010


def spin(core: int, share: float) -> None:
    """Take ``share`` of ``core``'s time at the highest CPU priority, in slices of at most ``PERIOD_S``:
    spin while behind that share of the time since the start, sleep while ahead (a sleep that
    overshoots is made up by the next spin)."""
    os.sched_setaffinity(0, {core})
    os.nice(-20)
    start, spun = time.perf_counter(), 0.0
    while True:
        now = time.perf_counter()
        behind = share * (now - start) - spun
        if behind > 0:
            until = now + min(behind + share * PERIOD_S, PERIOD_S)
            while time.perf_counter() < until:
                pass
            spun += time.perf_counter() - now
        else:
            time.sleep(-behind / share)


def loop_seconds(core: int, n: int = 20_000_000) -> float:
    """Wall time of a CPU-bound loop on ``core``."""
    os.sched_setaffinity(0, {core})
    start = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("factor", type=float, help="how many times slower each core runs (above 1)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.factor <= 1 or not command:
        ap.error("a FACTOR above 1 and a command are required")
    cores = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")
    before = loop_seconds(cores[0])
    spinners = [ctx.Process(target=spin, args=(c, 1 - 1 / args.factor), daemon=True) for c in cores]
    for p in spinners:
        p.start()
    try:
        time.sleep(0.5)
        after = loop_seconds(cores[0])
        os.sched_setaffinity(0, set(cores))
        print(f"slow_cores: {len(cores)} cores, a CPU-bound loop {after / before:.2f}x as long (asked {args.factor})", flush=True)
        start = time.monotonic()
        rc = subprocess.call(command)
        print(f"slow_cores: exit {rc} after {time.monotonic() - start:.0f} s", flush=True)
        return rc
    finally:
        for p in spinners:
            p.kill()


if __name__ == "__main__":
    sys.exit(main())
