"""Job-wide trigger: what it costs per optimizer step and per poll of the job's store.

Three figures, each in a fresh subprocess that imports opscope from a given checkout, so
the code before and after a change is timed alike, the runs interleaved (old, new, old,
new, ...) and the median kept:

- ``on_step`` idle: the on-demand agent's optimizer-step listener with nothing armed (what
  every training step pays while on-demand profiling is enabled);
- poll: one poll of the job's store by a rank's background thread (``JobRequests._tick``)
  against a real c10d TCPStore on 127.0.0.1 holding one past request; it runs every 0.2 s
  off the training thread;
- window limit: the time and memory check a recording window makes once per optimizer
  step (after the change only; nothing runs on the op path).

    python bench/trigger_cost.py --old /path/to/old/checkout [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS = 200_000
POLLS = 2_000
LIMIT_CHECKS = 20_000


def per_call_ns(fn, n: int) -> float:
    start = time.perf_counter_ns()
    for i in range(n):
        fn(i)
    return (time.perf_counter_ns() - start) / n


def child() -> None:
    import datetime

    from torch.distributed import TCPStore

    from opscope.collect.job import store as job_store
    from opscope.collect.job.store import JobStore
    from opscope.on_demand.agent import OnDemandAgent
    from opscope.on_demand.job import JobRequests

    agent = OnDemandAgent(pid=os.getpid())
    result = {"on_step_ns": per_call_ns(agent.on_step, STEPS)}
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=10))
    server.add("opscope/on_demand/requests", 1)  # one past request
    job_store.job_ranks = lambda: (1, 2)
    requests = JobRequests(agent)
    requests._stop.set()
    requests._thread.join(10)
    client = TCPStore("127.0.0.1", server.port, is_master=False,
                      timeout=datetime.timedelta(seconds=10))
    requests._opened = JobStore(client, 1, 2, cloned=True)
    requests._tick()
    result["poll_us"] = per_call_ns(lambda _: requests._tick(), POLLS) / 1000
    try:
        from opscope.on_demand.window_limit import WindowLimit
    except ImportError:
        result["limit_ns"] = None
    else:
        limit = WindowLimit()
        result["limit_ns"] = per_call_ns(lambda _: limit.exceeded(), LIMIT_CHECKS)
    print(json.dumps(result))


def run(checkout: str) -> dict:
    env = dict(os.environ, PYTHONPATH=checkout, OMP_NUM_THREADS="1")
    env.pop("OPSCOPE_ON_DEMAND", None)
    done = subprocess.run([sys.executable, __file__, "--child"], env=env, cwd=checkout,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"child in {checkout} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:] == ["--child"]:
        return child()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="checkout of the code before the change")
    p.add_argument("--new", default=str(REPO), help="checkout after it (default: this one)")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    samples = {"before": [], "after": []}
    for _ in range(args.reps):
        samples["before"].append(run(args.old))
        samples["after"].append(run(args.new))
    print("| figure | before | after |\n|---|---|---|")
    for name, unit in (("on_step_ns", "ns"), ("poll_us", "µs"), ("limit_ns", "ns")):
        cells = []
        for variant in ("before", "after"):
            values = [s[name] for s in samples[variant] if s[name] is not None]
            cells.append(f"{statistics.median(values):.3g} {unit}" if values else "n/a")
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    print(json.dumps(samples))


if __name__ == "__main__":
    main()
