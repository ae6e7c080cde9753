"""Multi-rank scale: ``opscope ranks --json``, ``opscope merge`` and ``opscope report`` on 64 ranks.

Writes 64 synthetic rank traces of 200,000 events each in torch.profiler's format
(``ProfilerStep#N`` ranges, CPU ops, per collective a ``c10d::allreduce_`` op on the main
thread and a ``gloo:all_reduce`` range on a worker thread, with input dims; rank
``STRAGGLER`` arrives ``LATE_US`` late at every collective), then times each command in
its own subprocess with its peak RSS (``os.wait4``'s ``ru_maxrss`` of that child), and
checks that ``opscope ranks --json`` names the straggler first. torch has no counterpart
(nothing in torch.profiler reads several ranks' traces), so there is no ratio.

    python bench/ranks_scale.py [--quick] [--json PATH] [--ranks N] [--events N] [--reps N]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import List

import numpy as np

import common

RANKS, RANKS_QUICK = 64, 4
EVENTS, EVENTS_QUICK = 200_000, 10_000
STEPS, STEPS_QUICK = 100, 5
COLLECTIVES_PER_STEP = 4
STRAGGLER = 37  # mod the number of ranks
LATE_US = 2000  # the straggler's lateness at each collective
SLOT_US = 10  # ops sit on a 10 us grid (5 us each); collectives in the gaps
TRANSFER_US = 300
BASE_NS = 1_795_000_000_000_000_000
OP_NAMES = ("aten::mm", "aten::add", "aten::relu", "aten::t", "aten::copy_", "aten::mul",
            "aten::empty", "aten::sum", "aten::view", "aten::addmm")
BUCKET_FLOATS = 1056


def rank_header(rank: int, world: int) -> str:
    info = {"backend": "gloo", "rank": rank, "world_size": world, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": world,
                           "ranks": list(range(world))}]}
    return json.dumps({"schemaVersion": 1, "deviceProperties": [], "record_shapes": 1,
                       "distributedInfo": info, "displayTimeUnit": "ms",
                       "baseTimeNanoseconds": BASE_NS})[:-1] + ', "traceEvents": [\n'


def arrivals(world: int, steps: int, ops: int) -> np.ndarray:
    """Collective arrival slots [rank, collective]: a grid point, jitter, the straggler late."""
    rng = np.random.default_rng(0)
    per_step = (np.arange(1, COLLECTIVES_PER_STEP + 1) * ops) // (COLLECTIVES_PER_STEP + 1)
    step_slots = ops + 2 * (LATE_US // SLOT_US) + 40
    base = (np.arange(steps)[:, None] * step_slots + per_step[None, :]).reshape(-1)
    slots = base[None, :] + rng.integers(0, 20, size=(world, base.size))
    slots[STRAGGLER % world] += LATE_US // SLOT_US
    return slots, step_slots


def write_rank(path: str, rank: int, world: int, steps: int, ops: int, slots: np.ndarray,
               step_slots: int) -> None:
    """One rank's trace, one line per event (no per-event json.dumps)."""
    pid, main, worker = 1000 + rank, 1000 + rank, 5000 + rank
    x = '{"ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d, "ts": %.3f, "dur": %.3f%s}'
    shapes = ', "args": {"Input type": ["float"], "Input Dims": [[%d]]}' % BUCKET_FLOATS
    ends = slots.max(axis=0) * SLOT_US + 6 + 1 + TRANSFER_US
    lines: List[str] = ['{"ph": "M", "name": "process_name", "pid": %d, "tid": 0, '
                        '"args": {"name": "rank %d"}}' % (pid, rank)]
    mine = slots[rank]
    op_names = [OP_NAMES[i % len(OP_NAMES)] for i in range(ops)]
    for k in range(steps):
        t0 = k * step_slots * SLOT_US
        lines.append(x % ("user_annotation", f"ProfilerStep#{k}", pid, main, t0,
                          step_slots * SLOT_US - 1, ""))
        starts = t0 + 20 + np.arange(ops) * SLOT_US
        lines += [x % ("cpu_op", n, pid, main, s, 5, "") for n, s in zip(op_names, starts)]
        for c in range(k * COLLECTIVES_PER_STEP, (k + 1) * COLLECTIVES_PER_STEP):
            arrive = 20 + mine[c] * SLOT_US + 6
            lines.append(x % ("cpu_op", "c10d::allreduce_", pid, main, arrive, 3, ""))
            lines.append(x % ("user_annotation", "gloo:all_reduce", pid, worker, arrive + 1,
                              ends[c] + 20 - arrive - 1, shapes))
    with open(path, "w") as f:
        f.write(rank_header(rank, world))
        f.write(",\n".join(lines))
        f.write("\n]}\n")


def generate(folder: str, world: int, events: int, steps: int) -> int:
    """Write the traces; return the events per rank."""
    ops = events // steps - 1 - 2 * COLLECTIVES_PER_STEP
    slots, step_slots = arrivals(world, steps, ops)
    for rank in range(world):
        write_rank(os.path.join(folder, f"train.rank{rank}.pt.trace.json"), rank, world,
                   steps, ops, slots, step_slots)
    return steps * (ops + 1 + 2 * COLLECTIVES_PER_STEP)


def run_measured(argv: List[str], stdout_path: str) -> dict:
    """Run ``python -m opscope ARGV``; wall seconds and the child's peak RSS."""
    env = dict(os.environ, PYTHONPATH=str(common.REPO), OMP_NUM_THREADS="1")
    with open(stdout_path, "w") as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "opscope", *argv], stdout=out,
                                stderr=err, env=env, cwd=common.REPO)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"ranks_scale: opscope {' '.join(argv)} failed ({proc.returncode}):"
                             f"\n{err.read().decode('utf-8', 'replace')[-3000:]}")
    return {"seconds": seconds, "peak_rss": usage.ru_maxrss * 1024,
            "load_average": round(os.getloadavg()[0], 2)}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, help=f"ranks (default {RANKS}, {RANKS_QUICK} quick)")
    p.add_argument("--events", type=int,
                   help=f"events per rank (default {EVENTS:,}, {EVENTS_QUICK:,} quick)")
    p.add_argument("--reps", type=int,
                   help="repetitions of each command (default: 3 of ranks, 1 of merge and "
                        "report; 1 of each with --quick)")
    args = common.parse_args(p)
    world = args.ranks or (RANKS_QUICK if args.quick else RANKS)
    events = args.events or (EVENTS_QUICK if args.quick else EVENTS)
    steps = STEPS_QUICK if args.quick else STEPS
    reps = {"ranks --json": args.reps or (1 if args.quick else 3),
            "merge": args.reps or 1, "report": args.reps or 1}
    rows, raw = [], {}
    with tempfile.TemporaryDirectory(prefix="ranks_scale") as tmp:
        folder = os.path.join(tmp, "job")
        os.makedirs(folder)
        t0 = time.perf_counter()
        per_rank = generate(folder, world, events, steps)
        gen_s = time.perf_counter() - t0
        trace_bytes = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
        commands = {
            "ranks --json": ["ranks", folder, "--json"],
            "merge": ["merge", folder, "-o", os.path.join(tmp, "merged.pt.trace.json")],
            "report": ["report", folder, "-o", os.path.join(tmp, "ranks.html")],
        }
        named = None
        for label, argv in commands.items():
            runs = []
            for _ in range(reps[label]):
                out = os.path.join(tmp, "stdout.txt")
                runs.append(run_measured(argv, out))
                if label == "ranks --json" and named is None:
                    doc = json.load(open(out))
                    named = [s["rank"] for s in doc["stragglers"]][:1]
                    matched = len(doc["collectives"])
            raw[label] = runs
            sec = [r["seconds"] for r in runs]
            rss = max(r["peak_rss"] for r in runs)
            load = max(r["load_average"] for r in runs)
            rows.append([f"opscope {label}", world, per_rank, len(sec), common.median(sec),
                         min(sec), round(rss / 2 ** 20), round(rss / trace_bytes, 2), load,
                         common.command_line("ranks_scale.py")])
            for name in ("merged.pt.trace.json", "ranks.html"):
                if os.path.exists(os.path.join(tmp, name)):
                    os.unlink(os.path.join(tmp, name))
    straggler = STRAGGLER % world
    ok = named == [straggler]
    notes = [f"{world} synthetic ranks x {per_rank:,} events ({world * per_rank:,} events, "
             f"{trace_bytes / 2 ** 30:.2f} GiB of torch-format .json) with "
             f"{steps * COLLECTIVES_PER_STEP} allreduces per rank; written in {gen_s:.0f} s. "
             f"Rank {straggler} arrives {LATE_US / 1000:g} ms late at every collective: "
             f"`opscope ranks --json` named {named} first "
             f"({'as expected' if ok else 'WRONG: expected ' + str([straggler])}) and "
             f"matched {matched:,} collectives.",
             "Each command runs in its own process (times are wall seconds, medians of the "
             "repetitions, 3 of `ranks` and 1 of the others by default; peak RSS is that process's `ru_maxrss`, the largest over the "
             "repetitions). The load average column shows how busy this shared 2-core host was: "
             "above 2, the times are stretched by other work. RSS / trace bytes compares with HTA's about 5x. torch has no "
             "counterpart (torch.profiler reads no other rank's trace), so there is no "
             "ratio to torch. No target yet."]
    common.finish({"title": "Multi-rank scale: ranks, merge and the job report",
                   "command": common.command_line("ranks_scale.py"),
                   "machine": common.machine_info(),
                   "columns": ["command", "ranks", "events per rank", "reps", "median s",
                               "min s", "peak RSS MiB", "peak RSS / trace bytes",
                               "load avg (1 min, highest at a run's end)", "reproduce"],
                   "rows": rows, "targets": [], "notes": notes,
                   "straggler_named": ok, "raw": raw}, args)
    if not ok:
        raise SystemExit(f"ranks_scale: expected rank {straggler} first among the "
                         f"stragglers, got {named}")


if __name__ == "__main__":
    main()
