"""What every collective's facts cost (issue 31): per collective, at stop, and for other ops.

Runs a gloo job of ``--world`` ranks (2) under torchrun ``--jobs`` times, alternating
torch's flight recorder on (``TORCH_FR_BUFFER_SIZE`` unset: torch 2.13 keeps 2,000
collectives by default) and off (``TORCH_FR_BUFFER_SIZE=0``, so opscope has no facts to
read). Rank 0 measures, each figure the median of its repetitions:

- ``allreduce_us``: one ``dist.all_reduce`` of 16 floats, no profiler, wall and CPU time
  of the process (the recorder's own cost per collective is the on/off difference: torch's,
  paid with or without opscope);
- ``add_ns``: CPU time of one ``torch.add`` of 2-element tensors inside
  ``opscope.profile()`` (an ordinary op: opscope's observer does nothing more for it
  either way);
- ``wrapped_us`` and ``note_us``: while a window records, opscope wraps torch's
  ProcessGroup methods (``collect/job/process_group_calls.py``): CPU time of the same
  all_reduce with the wrappers on (interleaved with ``allreduce_cpu_us`` off, 5 times
  each), and of the wrapper's own bookkeeping for one call (group, sizes, call site);
- ``stop_ms`` and ``export_ms``: CPU time of the process to leave an ``opscope.profile()``
  window of ``--collectives`` all_reduces (the stop reads the recorder), and to
  ``export_chrome_trace`` it (the join of the recorder's rows to the ops, and their args).

    python bench/collective_facts_cost.py [--jobs 6] [--collectives 1000] [--world 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def _per_call_ns(fn, calls: int, reps: int, clock=time.perf_counter_ns) -> float:
    times = []
    for _ in range(reps):
        t0 = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - t0) / calls)
    return statistics.median(times)


def worker(collectives: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    import opscope

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.ones(16)
    a, b = torch.ones(2), torch.ones(2)
    _per_call_ns(lambda: dist.all_reduce(t), 200, 1)  # warm up
    allreduce = _per_call_ns(lambda: dist.all_reduce(t), 500, 5)
    from opscope.collect.job.process_group_calls import METHODS, ProcessGroupCalls

    plain, wrapped = [], []
    for _ in range(5):  # interleaved: the wrappers off, then on
        plain.append(_per_call_ns(lambda: dist.all_reduce(t), 500, 1, time.process_time_ns))
        calls = ProcessGroupCalls()
        calls.install()
        wrapped.append(_per_call_ns(lambda: dist.all_reduce(t), 500, 1, time.process_time_ns))
        calls.uninstall()
    allreduce_cpu, wrapped_cpu = statistics.median(plain), statistics.median(wrapped)
    calls, group, frame = ProcessGroupCalls(), dist.group.WORLD, sys._getframe()
    note = _per_call_ns(lambda: calls._note("allreduce", METHODS["allreduce"], group, ([t],),
                                            0, frame), 2000, 5, time.process_time_ns)
    adds, stops, exports = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        for rep in range(3):
            with opscope.profile():
                adds.append(_per_call_ns(lambda: torch.add(a, b), 20000, 1,
                                         time.process_time_ns))
            prof = opscope.profile()
            prof.start()
            for _ in range(collectives):
                dist.all_reduce(t)
            t0 = time.process_time()
            prof.stop()
            t1 = time.process_time()
            prof.export_chrome_trace(os.path.join(folder, f"w{rep}.json"))
            stops.append(t1 - t0)
            exports.append(time.process_time() - t1)
        with open(os.path.join(folder, "w0.json")) as f:
            args = sum('"Seq": ' in line for line in f)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({
            "allreduce_us": allreduce / 1e3, "allreduce_cpu_us": allreduce_cpu / 1e3,
            "wrapped_us": wrapped_cpu / 1e3, "note_us": note / 1e3,
            "add_ns": statistics.median(adds),
            "stop_ms": 1e3 * statistics.median(stops),
            "export_ms": 1e3 * statistics.median(exports), "events_with_seq": args}))
    time.sleep(0.2)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(recorder: bool, collectives: int, world: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    if not recorder:
        env["TORCH_FR_BUFFER_SIZE"] = "0"
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
                          "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), HERE,
                          "--worker", "--collectives", str(collectives)],
                         env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"job failed: {out.stderr[-2000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=6)
    p.add_argument("--collectives", type=int, default=1000)
    p.add_argument("--world", type=int, default=2,
                   help="ranks (1: no peer to wait for, so an all_reduce is its CPU cost)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.collectives)
    results = {True: [], False: []}
    for i in range(args.jobs):  # alternate, starting with each mode in turn
        recorder = i % 4 in (0, 3)
        results[recorder].append(run_job(recorder, args.collectives, args.world))
    print(f"{args.world} rank(s); load average at the end: {os.getloadavg()[0]:.2f}")
    print("| flight recorder | jobs | all_reduce us, wall (no profiler) | all_reduce us, CPU | "
          "same, wrappers on | one note us CPU | "
          f"torch.add ns CPU (profiled) | stop ms CPU ({args.collectives} collectives) | "
          "export ms CPU | events with Seq |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for recorder in (True, False):
        rows = results[recorder]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"| {'on (default)' if recorder else 'off (=0)'} | {len(rows)} | "
              f"{med['allreduce_us']:.1f} | {med['allreduce_cpu_us']:.1f} | "
              f"{med['wrapped_us']:.1f} | {med['note_us']:.2f} | "
              f"{med['add_ns']:.0f} | {med['stop_ms']:.1f} | "
              f"{med['export_ms']:.1f} | {med['events_with_seq']:.0f} |")


if __name__ == "__main__":
    main()
