"""Store scale: ``opscope convert`` of 64 ranks x 1M events, queries on the store, and HTA.

    python bench/store_scale.py generate DIR [--ranks 64] [--events 1000000]
    python bench/store_scale.py run DIR [--ranks 64] [--events 1000000] [--jobs N] [--hta N]
                                        [--json PATH] [--keep]
    python bench/store_scale.py [--quick] [--json PATH]   (generate + run, small, in a temp DIR)

``generate`` writes synthetic rank traces as torch 2.13's profiler writes them (Kineto's
layout, ``distributedInfo`` with rank and world size, ``ProfilerStep#N`` ranges, nested
``cpu_op`` events with ``Input Dims``/``Input type``/``Input Strides``/``Concrete Inputs``,
per collective a ``c10d::allreduce_`` op on the main thread and a ``gloo:all_reduce``
range on a second thread), about 300 bytes an event, streamed one step at a time. Rank
``STRAGGLER`` (mod the ranks) arrives ``LATE_US`` late at every collective.

``run`` times ``opscope convert DIR -o STORE``, ``opscope ranks STORE --json`` (or, when
that verb does not read stores yet, ``connect()`` and the straggler SQL) and ``opscope
query STORE SQL`` (or ``connect()`` and the SQL), each in its own process with the peak
RSS of its whole process tree; checks that the straggler is named; compares the store's
size with the traces'; then loads 1, 2, 4, ... ranks with Holistic Trace Analysis
(``hta``'s ``TraceAnalysis``) in a subprocess capped at ``HTA_CAP`` bytes of RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import numpy as np

import common

STRAGGLER = 37  # mod the number of ranks
LATE_US = 10_000  # the straggler's lateness at each collective (over 5% of a step)
COLLECTIVES_PER_STEP = 4
TRANSFER_US = 300
EVENTS_PER_STEP = 10_000
TS0_US = 4_628_298_828_000  # Kineto's microsecond clock (since boot)
BASE_NS = 1_790_857_026_000_000_000
HTA_CAP = 8 * 2 ** 30
TOP_OPS_SQL = ("SELECT name, count(*) AS calls, sum(self_ns) / 1e6 AS self_ms FROM events "
               "GROUP BY name ORDER BY self_ms DESC LIMIT 20")

# One layer of a step: (depth, category, name, start us, duration us, args) relative to
# the layer's start; 8 nested events, the forward of a Linear + ReLU + a bias add.
_LINEAR = (
    (0, "cpu_op", "aten::linear", 0.0, 40.0, "lin"),
    (1, "cpu_op", "aten::t", 1.0, 7.0, "t"),
    (2, "cpu_op", "aten::transpose", 2.0, 5.0, "tr"),
    (3, "cpu_op", "aten::as_strided", 3.0, 2.5, "as"),
    (1, "cpu_op", "aten::addmm", 10.0, 28.0, "addmm"),
    (0, "cpu_op", "aten::relu", 42.0, 8.0, "relu"),
    (1, "cpu_op", "aten::clamp_min", 43.0, 6.0, "relu"),
    (0, "cpu_op", "aten::add_", 52.0, 4.0, "add"),
)
LAYER_US = 60.0
_ARGS = {  # Concrete Inputs, Input type, Input Dims
    "lin": ('["", "", ""]', '["float", "float", "float"]',
            '[[64, 512], [512, 512], [512]]'),
    "t": ('[""]', '["float"]',
            '[[512, 512]]'),
    "tr": ('["", "0", "1"]', '["float", "Int", "Int"]',
            '[[512, 512], [], []]'),
    "as": ('["", "[512, 512]", "[1, 512]", ""]', '["float", "IntList", "IntList", ""]',
            '[[512, 512], [], [], []]'),
    "addmm": ('["", "", "", "1", "1"]', '["float", "float", "float", "Scalar", "Scalar"]',
            '[[512], [64, 512], [512, 512], [], []]'),
    "relu": ('[""]', '["float"]',
            '[[64, 512]]'),
    "add": ('["", "", "1"]', '["float", "float", "Scalar"]',
            '[[64, 512], [64, 512], []]'),
    "c10d": ('["", "", "", "", "-1"]', '["TensorList", "", "", "", "Int"]',
            '[[], [], [], [], []]'),
}
_EVENT = ('  {\n    "ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d,\n'
          '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      "External id": %d,'
          '"Record function id": 0, %s"Ev Idx": %d\n    }\n  }')
_INPUTS = '"Concrete Inputs": %s, "Input type": %s, "Input Dims": %s, '


def _header(rank: int, world: int) -> str:
    info = {"backend": "gloo", "rank": rank, "world_size": world, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": world,
                           "ranks": list(range(world))}], "nccl_version": ""}
    head = {"schemaVersion": 1, "deviceProperties": [], "distributedInfo": info,
            "record_shapes": 1, "host_name": "node%d" % (rank // 8),
            "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS}
    text = json.dumps(head, indent=2)[:-2]
    pid = 1000 + rank
    meta = ['{"ph": "M", "name": "process_name", "ts": %.3f, "pid": %d, "tid": 0, '
            '"args": {"name": "python"}}' % (TS0_US, pid)]
    for tid, name in ((pid, "python"), (5000 + rank, "gloo worker")):
        meta.append('{"ph": "M", "name": "thread_name", "ts": %.3f, "pid": %d, "tid": %d, '
                    '"args": {"name": "thread %d (%s)"}}' % (TS0_US, pid, tid, tid, name))
    return text + ',\n  "traceEvents": [\n' + ",\n".join("  " + m for m in meta)


class _Plan:
    """The job's shape: layers per step, collective slots, every rank's arrivals."""

    def __init__(self, world: int, events: int, events_per_step: int = EVENTS_PER_STEP) -> None:
        self.steps = max(1, events // events_per_step)
        per_step = events // self.steps - 1 - 2 * COLLECTIVES_PER_STEP
        self.layers = max(COLLECTIVES_PER_STEP, -(-per_step // len(_LINEAR)))  # at least `events`
        self.gap_us = LATE_US + 100 + TRANSFER_US + 50  # a collective's window
        self.step_us = self.layers * LAYER_US + COLLECTIVES_PER_STEP * self.gap_us + 20
        rng = np.random.default_rng(0)
        n = self.steps * COLLECTIVES_PER_STEP
        self.jitter = rng.uniform(0, 100, size=(world, n)).round(3)
        self.jitter[STRAGGLER % world] += LATE_US
        self.end = self.jitter.max(axis=0) + TRANSFER_US  # relative to the window's start
        self.events = self.steps * (1 + self.layers * len(_LINEAR) + 2 * COLLECTIVES_PER_STEP)


def _step_text(plan: _Plan, rank: int, k: int, counter: List[int]) -> str:
    """The events of step ``k`` of ``rank`` (counter: External id / Ev Idx so far)."""
    pid, main, worker = 1000 + rank, 1000 + rank, 5000 + rank
    t0 = TS0_US + 10.0 + k * plan.step_us
    out = [_EVENT % ("user_annotation", "ProfilerStep#%d" % k, pid, main, t0,
                     plan.step_us - 5.0, counter[0] + 1, "", counter[0])]
    counter[0] += 1
    every = plan.layers // COLLECTIVES_PER_STEP
    t = t0 + 10.0
    for layer in range(plan.layers):
        for _, cat, name, rel, dur, key in _LINEAR:
            out.append(_EVENT % (cat, name, pid, main, t + rel, dur, counter[0] + 1,
                                 _INPUTS % _ARGS[key], counter[0]))
            counter[0] += 1
        t += LAYER_US
        c = (layer + 1) // every - 1
        if (layer + 1) % every == 0 and c < COLLECTIVES_PER_STEP:
            col = k * COLLECTIVES_PER_STEP + c
            arrive = t + plan.jitter[rank, col]
            end = t + plan.end[col]
            out.append(_EVENT % ("cpu_op", "c10d::allreduce_", pid, main, arrive, 6.0,
                                 counter[0] + 1, _INPUTS % _ARGS["c10d"], counter[0]))
            out.append(_EVENT % ("user_annotation", "gloo:all_reduce", pid, worker,
                                 arrive + 1.0, end - arrive - 1.0, counter[0] + 2, "",
                                 counter[0] + 1))
            counter[0] += 2
            t += plan.gap_us
    return ",\n".join(out)


def write_rank(path: str, rank: int, world: int, plan: _Plan) -> None:
    """One rank's trace, written a step at a time (bounded memory)."""
    counter = [0]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(_header(rank, world))
        for k in range(plan.steps):
            f.write(",\n")
            f.write(_step_text(plan, rank, k, counter))
        end_us = TS0_US + 10.0 + plan.steps * plan.step_us
        f.write(',\n  {\n    "ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", '
                '"pid": "Spans", "tid": "PyTorch Profiler",\n    "ts": %.3f, "dur": %.3f,\n'
                '    "args": {\n      "Op count": 0\n    }\n  }\n  ],'
                '"traceName": "%s" }\n' % (TS0_US, end_us - TS0_US, os.path.basename(path)))
    os.replace(tmp, path)


def generate(folder: str, world: int, events: int, jobs: int = 1,
             events_per_step: int = EVENTS_PER_STEP) -> dict:
    """Write ``world`` rank traces of about ``events`` events; return what was written."""
    os.makedirs(folder, exist_ok=True)
    plan = _Plan(world, events, events_per_step)
    t0 = time.perf_counter()
    names = [os.path.join(folder, "train.rank%d.pt.trace.json" % r) for r in range(world)]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            list(pool.map(write_rank, names, range(world), [world] * world, [plan] * world))
    else:
        for rank, path in enumerate(names):
            write_rank(path, rank, world, plan)
    size = sum(os.path.getsize(p) for p in names)
    return {"ranks": world, "events_per_rank": plan.events, "bytes": size,
            "seconds": time.perf_counter() - t0,
            "bytes_per_event": size / (world * plan.events),
            "straggler": STRAGGLER % world, "steps": plan.steps}


def _tree(pid: int) -> List[int]:
    """``pid`` and its descendants (from /proc/PID/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _memory(pids: List[int]) -> tuple:
    """(summed RSS, summed PSS) bytes of ``pids`` (PSS counts shared pages once)."""
    rss = pss = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return rss, pss


def measured(argv: List[str], stdout_path: str, cap: Optional[int] = None,
             env: Optional[dict] = None) -> dict:
    """Run ``argv``; wall s, peak summed RSS and PSS of its process tree (sampled 10/s).

    With ``cap``, the tree is killed when its RSS passes ``cap`` bytes.
    """
    env = dict(os.environ, PYTHONPATH=str(common.REPO), OMP_NUM_THREADS="1", **(env or {}))
    peak_rss = peak_pss = 0
    killed = False
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(stdout_path, "w") as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=common.REPO)
        while proc.poll() is None:
            rss, pss = _memory(_tree(proc.pid))
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            if cap is not None and rss > cap:
                killed = True
                for p in reversed(_tree(proc.pid)):
                    try:
                        os.kill(p, 9)
                    except OSError:
                        pass
            time.sleep(0.1)
        seconds = time.perf_counter() - t0
        err.seek(0)
        tail = err.read().decode("utf-8", "replace")[-2000:]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the tree's CPU, once reaped
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"seconds": round(seconds, 2), "cpu_seconds": round(cpu, 1),
            "peak_rss": peak_rss, "peak_pss": peak_pss,
            "returncode": proc.returncode, "killed_at_cap": killed, "stderr_tail": tail,
            "load_average": round(os.getloadavg()[0], 2)}


_OPSCOPE = ("import sys\nfrom opscope.cli import main, convert\n"
            "if convert not in main.VERBS:\n    main.VERBS = main.VERBS + (convert,)\n"
            "main.main(sys.argv[1:])\n")
_RANKS_SQL = ("import sys, json\nfrom opscope.store import connect\n"
              "con = connect(sys.argv[1])\n"
              "rows = con.execute(\"SELECT rank, avg(late_ns) AS late, count(*) AS n FROM "
              "collective_ranks GROUP BY rank ORDER BY late DESC, rank\").fetchall()\n"
              "print(json.dumps({'stragglers': [{'rank': rows[0][0]}], 'rows': rows}))\n")


def opscope_cmd(*argv: str) -> List[str]:
    """``opscope ARGV`` (the convert verb registered even where cli/main lacks it)."""
    return [sys.executable, "-c", _OPSCOPE, *argv]


def _has_verb(verb: str, flag: str) -> bool:
    """Whether ``opscope VERB --help`` mentions ``flag`` (the verb reads stores)."""
    proc = subprocess.run(opscope_cmd(verb, "--help"), capture_output=True, text=True,
                          cwd=common.REPO, env=dict(os.environ, PYTHONPATH=str(common.REPO)))
    return proc.returncode == 0 and flag in proc.stdout

_HTA = ("import sys, time\nt0 = time.perf_counter()\n"
        "from hta.trace_analysis import TraceAnalysis\n"
        "a = TraceAnalysis(trace_dir=sys.argv[1])\n"
        "print('HTA', len(a.t.traces), time.perf_counter() - t0)\n")


def hta_runs(folder: str, world: int, tmp: str, most: int) -> List[dict]:
    """HTA's TraceAnalysis on the first 1, 2, 4 ... ranks, until one passes HTA_CAP."""
    out = []
    n = 1
    while n <= min(world, most):
        sub = os.path.join(tmp, "hta%d" % n)
        os.makedirs(sub, exist_ok=True)
        for r in range(n):
            name = "train.rank%d.pt.trace.json" % r
            os.symlink(os.path.join(folder, name), os.path.join(sub, name))
        run = measured([sys.executable, "-c", _HTA, sub], os.path.join(tmp, "hta.txt"),
                       cap=HTA_CAP)
        run["ranks"] = n
        run["ok"] = run["returncode"] == 0 and not run["killed_at_cap"]
        out.append(run)
        print("HTA %d ranks: %s" % (n, {k: v for k, v in run.items() if k != "stderr_tail"}),
              flush=True)
        shutil.rmtree(sub)
        if not run["ok"]:
            break
        n *= 2
    return out


def run(folder: str, world: int, jobs: int, hta_most: int, keep: bool) -> dict:
    """Convert, query, check the straggler, HTA; the measurements."""
    tmp = tempfile.mkdtemp(prefix="store_scale_", dir=os.path.dirname(os.path.abspath(folder)))
    store = os.path.join(tmp, "job.store")
    out = {"jobs": jobs}
    try:
        out["trace_bytes"] = sum(os.path.getsize(os.path.join(folder, n))
                                 for n in os.listdir(folder))
        conv = measured(opscope_cmd("convert", folder, "-o", store, "--jobs", str(jobs)),
                        os.path.join(tmp, "convert.txt"))
        if conv["returncode"] != 0:
            raise SystemExit("store_scale: convert failed: " + conv["stderr_tail"])
        out["convert"] = conv
        print("convert:", {k: v for k, v in conv.items() if k != "stderr_tail"}, flush=True)
        out["store_bytes"] = sum(os.path.getsize(os.path.join(d, f))
                                 for d, _, fs in os.walk(store) for f in fs)
        ranks_out = os.path.join(tmp, "ranks.json")
        ranks = measured(opscope_cmd("ranks", store, "--json"), ranks_out)
        ranks["how"] = "opscope ranks STORE --json"
        if ranks["returncode"] != 0:  # the verb does not read stores (yet): its SQL
            ranks = measured([sys.executable, "-c", _RANKS_SQL, store], ranks_out)
            ranks["how"] = "connect(STORE) + SQL on collective_ranks (late_ns by rank)"
        out["ranks"] = ranks
        if ranks["returncode"] != 0:
            raise SystemExit("store_scale: the ranks step failed: " + ranks["stderr_tail"])
        doc = json.load(open(ranks_out))
        out["straggler_named"] = [s["rank"] for s in doc.get("stragglers", [])][:1]
        print("ranks:", {k: v for k, v in ranks.items() if k != "stderr_tail"},
              out["straggler_named"], flush=True)
        query = measured(opscope_cmd("query", store, TOP_OPS_SQL),
                         os.path.join(tmp, "query.txt"))
        query["how"] = "opscope query STORE (top 20 ops by self time)"
        out["query"] = query
        out["query_output"] = open(os.path.join(tmp, "query.txt")).read()[:3000]
        print("query:", {k: v for k, v in query.items() if k != "stderr_tail"}, flush=True)
        out["hta"] = hta_runs(folder, world, tmp, hta_most)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def result_of(gen: dict, got: dict) -> dict:
    """The bench result (common.finish's dict) of a generate and a run."""
    world, per = gen["ranks"], gen["events_per_rank"]
    mib = 2 ** 20
    rows, targets = [], []
    for label, key, limit_s, limit_b in (("opscope convert", "convert", 600, 1.5 * 2 ** 30),
                                         ("ranks on the store", "ranks", 30, 2 ** 30),
                                         ("opscope query (top 20 ops)", "query", 30, 2 ** 30)):
        r = got[key]
        rows.append([label, r.get("how", "opscope convert DIR -o STORE --jobs %d" % got["jobs"]),
                     world, per, r["seconds"], r["cpu_seconds"], round(r["peak_rss"] / mib),
                     round(r["peak_pss"] / mib), r["load_average"]])
        full = world >= 64 and per >= 900_000  # the generator rounds to whole steps
        targets.append(common.target(f"{label} time (64 x 1M)", r["seconds"] if full else None,
                                     limit_s, " s"))
        targets.append(common.target(f"{label} peak memory (64 x 1M), GiB",
                                     r["peak_pss"] / 2 ** 30 if full else None,
                                     limit_b / 2 ** 30))
    ratio = got["store_bytes"] / got["trace_bytes"]
    targets.append(common.target("store size / JSON size", ratio, 1 / 20))
    for h in got["hta"]:
        rows.append(["HTA TraceAnalysis load", "%d rank(s)%s" % (
            h["ranks"], "" if h["ok"] else " (killed at 8 GiB RSS)" if h["killed_at_cap"]
            else " (failed)"), h["ranks"], per, h["seconds"], h["cpu_seconds"],
            round(h["peak_rss"] / mib),
            round(h["peak_pss"] / mib), h["load_average"]])
    straggler = gen["straggler"]
    notes = [
        f"{world} synthetic ranks x {per:,} events ({world * per:,} events, "
        f"{got['trace_bytes'] / 2 ** 30:.2f} GiB of torch-format .json, "
        f"{gen['bytes_per_event']:.0f} bytes an event), written in {gen['seconds']:.0f} s by "
        f"`bench/store_scale.py generate`. The store is {got['store_bytes'] / 2 ** 20:.1f} MiB "
        f"({ratio:.3f} of the JSON).",
        f"Rank {straggler} arrives {LATE_US / 1000:g} ms late at every collective: the ranks "
        f"step named {got['straggler_named']} "
        f"({'as expected' if got['straggler_named'] == [straggler] else 'WRONG'}).",
        "Each command runs in its own process; peak memory is sampled 10 times a second "
        "over its whole process tree: RSS summed (shared pages counted in every process) "
        "and PSS summed (shared pages split: the memory the tree really holds). The targets "
        "use PSS. The load average shows how busy this shared 2-core host was (above 2, "
        "times are stretched by other work).",
        "HTA loads the first 1, 2, 4 ... ranks of the same traces (symlinked) in a child "
        "killed when its tree passes 8 GiB RSS; it parses every rank's whole JSON into "
        "pandas frames, where opscope convert streams each trace once into Parquet."]
    return {"title": "Store scale: convert, ranks and query on 64 ranks x 1M events, and HTA",
            "command": common.command_line("store_scale.py"),
            "machine": common.machine_info(),
            "columns": ["command", "how", "ranks", "events per rank", "wall s", "CPU s (tree)",
                        "peak RSS MiB (tree)", "peak PSS MiB (tree)", "load avg"],
            "rows": rows, "targets": targets, "notes": notes, "raw": {"gen": gen, "run": got}}


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] in ("generate", "run"):
        p = argparse.ArgumentParser(prog="store_scale.py " + argv[0])
        p.add_argument("folder")
        p.add_argument("--ranks", type=int, default=64)
        p.add_argument("--events", type=int, default=1_000_000)
        p.add_argument("--jobs", type=int, default=2)
        p.add_argument("--hta", type=int, default=64, help="most ranks HTA tries")
        p.add_argument("--json", help="write the result here")
        p.add_argument("--keep", action="store_true", help="keep the store")
        args = p.parse_args(argv[1:])
        if argv[0] == "generate":
            gen = generate(args.folder, args.ranks, args.events, args.jobs)
            print(json.dumps(gen))
            with open(os.path.join(args.folder, ".generated.json"), "w") as f:
                json.dump(gen, f)
            return
        gen = json.load(open(os.path.join(args.folder, ".generated.json")))
        got = run(args.folder, gen["ranks"], args.jobs, args.hta, args.keep)
        ns = argparse.Namespace(quick=False, json=args.json)
        common.finish(result_of(gen, got), ns)
        return
    p = common.parser(__doc__.splitlines()[0])
    args = common.parse_args(p)
    with tempfile.TemporaryDirectory(prefix="store_scale") as tmp:
        folder = os.path.join(tmp, "job")
        ranks, events = (4, 20_000) if args.quick else (64, 1_000_000)
        gen = generate(folder, ranks, events, 2)
        got = run(folder, ranks, 2, 2 if args.quick else 64, False)
    common.finish(result_of(gen, got), args)


if __name__ == "__main__":
    main()
