"""The hang detector's cost: per collective that completes, per poll, and per ask.

Real torchrun jobs of 2 gloo ranks on this host. Each rank times rounds of
``--collectives`` all_reduces of 4 floats (a collective whose own cost is mostly
gloo's round trip, so any added cost shows); the rounds alternate, in the same
processes, between the hang detector off and on (a ``HangWatch`` with its thread
polling every ``POLL_S``, on the job's real c10d store). Jobs alternate between
torch's flight recorder off (``TORCH_FR_BUFFER_SIZE=0``) and on (2000 entries,
torch 2.13's default, which ``opscope run`` sets where the user has not), so the
three variants are: recorder off; recorder on; recorder on + detector. Rank 0
also times one poll (``HangWatch.tick`` with nothing stuck) and what a rank does
once per ask (``rank_state`` with the recorder's buffer full).

    python bench/hang_watch_cost.py [--reps 3] [--rounds 6] [--collectives 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child(args: argparse.Namespace) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from opscope.collect.job.live_collectives import rank_state
    from opscope.on_demand.hang import HangWatch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, x = dist.get_rank(), torch.ones(4)
    folder = tempfile.mkdtemp()
    for _ in range(2000):  # warm up; fills the recorder's buffer
        dist.all_reduce(x)
    rounds = {"off": [], "on": []}
    cpu = {"off": [], "on": []}  # this process's CPU time (all threads), less stretched by load
    for n in range(args.rounds):
        variant = "on" if n % 2 else "off"
        watch = HangWatch.start(folder, folder, 10.0) if variant == "on" else None
        dist.barrier()
        time.sleep(1.0)  # the watch has opened its store connection
        start, cpu_start = time.perf_counter_ns(), time.process_time_ns()
        for _ in range(args.collectives):
            dist.all_reduce(x)
        rounds[variant].append((time.perf_counter_ns() - start) / args.collectives / 1e3)
        cpu[variant].append((time.process_time_ns() - cpu_start) / args.collectives / 1e3)
        if watch is not None:
            watch.close()
    result = {"rounds_us": rounds, "cpu_us": cpu}
    if rank == 0:
        watch = HangWatch(folder, folder, 10.0)
        watch.tick(time.monotonic())  # opens the store
        polls = []
        for _ in range(200):
            start = time.perf_counter_ns()
            watch.tick(time.monotonic())
            polls.append((time.perf_counter_ns() - start) / 1e3)
        start = time.perf_counter_ns()
        state = rank_state(0)
        result.update(poll_us=statistics.median(polls),
                      state_ms=(time.perf_counter_ns() - start) / 1e6,
                      state_bytes=len(json.dumps(state)) if state else 0)
        with open(args.child, "w") as f:
            json.dump(result, f)
    dist.barrier()
    time.sleep(0.1)  # gloo's last-collective race at exit (pytorch #190489)
    dist.destroy_process_group()


def run_job(buffer: str, args: argparse.Namespace) -> dict:
    out = tempfile.mktemp(suffix=".json")
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": buffer, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", __file__, "--child", out, "--rounds", str(args.rounds), "--collectives",
           str(args.collectives)]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=900)
    with open(out) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--collectives", type=int, default=20_000)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    per = {"recorder off": [], "recorder on": [], "recorder on + detector": []}
    per_cpu = {name: [] for name in per}
    polls, states = [], []
    for _ in range(args.reps):
        for buffer in ("0", "2000"):
            result = run_job(buffer, args)
            for table, field in ((per, "rounds_us"), (per_cpu, "cpu_us")):
                rounds = result[field]
                if buffer == "0":
                    table["recorder off"] += rounds["off"]
                else:
                    table["recorder on"] += rounds["off"]
                    table["recorder on + detector"] += rounds["on"]
                polls.append(result["poll_us"])
                states.append((result["state_ms"], result["state_bytes"]))
    load = os.getloadavg()[0]
    print(f"load average (1 min) at the end: {load:.2f}")
    print("| variant | rounds | wall us per all_reduce: median (min-max) | rank 0's CPU us "
          "per all_reduce: median (min-max) |")
    print("|---|---|---|---|")
    for name, values in per.items():
        cpu = per_cpu[name]
        print(f"| {name} | {len(values)} | {statistics.median(values):.1f} ({min(values):.1f}-"
              f"{max(values):.1f}) | {statistics.median(cpu):.1f} ({min(cpu):.1f}-"
              f"{max(cpu):.1f}) |")
    print(f"one poll with nothing stuck (rank 0, real TCPStore): median "
          f"{statistics.median(polls):.0f} us")
    print(f"one rank's state at an ask (2000 recorder entries): "
          f"{statistics.median(s[0] for s in states):.1f} ms, {states[-1][1]} bytes")


if __name__ == "__main__":
    main()
