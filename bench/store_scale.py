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
from typing import Dict, List, Optional

import numpy as np

import common

STRAGGLER = 37  # mod the number of ranks
LATE_US = 2000  # the straggler's lateness at each collective
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

    def __init__(self, world: int, events: int) -> None:
        self.steps = max(1, events // EVENTS_PER_STEP)
        per_step = events // self.steps - 1 - 2 * COLLECTIVES_PER_STEP
        self.layers = max(COLLECTIVES_PER_STEP, per_step // len(_LINEAR))
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


def generate(folder: str, world: int, events: int, jobs: int = 1) -> dict:
    """Write ``world`` rank traces of about ``events`` events; return what was written."""
    os.makedirs(folder, exist_ok=True)
    plan = _Plan(world, events)
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
            "straggler": STRAGGLER % world}
