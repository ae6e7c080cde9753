"""Sessions for the report tests: a real training profile, and a synthetic million events.

``large_session(n_events)`` builds a RawSession with numpy (no per-event Python)
by tiling one step's template: ``ProfilerStep#k`` > forward / backward /
optimizer ranges > nested aten ops, on two threads, then analyses it with
``build_session`` like a live profile.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile

import numpy as np

import opscope
from opscope.analysis.build import build_session
from opscope.model.records import (NO_INPUTS, RECORD_DTYPE, SCOPE_BACKWARD_FUNCTION,
                                   SCOPE_FUNCTION, SCOPE_USER, RawSession)
from opscope.model.session import OPTION_NAMES
from workloads import mlp_step_fn

def _step_template(layers: int):
    """One step's events: (name, start ns, end ns, scope) from the step start; step length."""
    ev = [("forward", 1_000, 0, SCOPE_USER)]
    t = 2_000
    for _ in range(layers):
        ev += [("aten::linear", t, t + 9_000, SCOPE_FUNCTION),
               ("aten::t", t + 100, t + 1_100, SCOPE_FUNCTION),
               ("aten::transpose", t + 200, t + 900, SCOPE_FUNCTION),
               ("aten::as_strided", t + 300, t + 600, SCOPE_FUNCTION),
               ("aten::addmm", t + 1_500, t + 8_500, SCOPE_FUNCTION),
               ("aten::relu", t + 9_500, t + 12_000, SCOPE_FUNCTION),
               ("aten::clamp_min", t + 9_800, t + 11_500, SCOPE_FUNCTION)]
        t += 13_000
    ev[0] = ("forward", 1_000, t, SCOPE_USER)
    bstart = t + 1_000
    t = bstart + 500
    for _ in range(layers):
        ev += [("autograd::engine::evaluate_function: AddmmBackward0", t, t + 12_000,
                SCOPE_FUNCTION),
               ("AddmmBackward0", t + 200, t + 11_000, SCOPE_BACKWARD_FUNCTION),
               ("aten::mm", t + 400, t + 5_000, SCOPE_FUNCTION),
               ("aten::mm", t + 5_500, t + 10_500, SCOPE_FUNCTION)]
        t += 12_500
    ev.append(("backward", bstart, t, SCOPE_USER))
    ostart = t + 500
    t = ostart + 500
    for _ in range(layers):
        ev += [("aten::add_", t, t + 4_000, SCOPE_FUNCTION),
               ("aten::copy_", t + 4_200, t + 4_900, SCOPE_FUNCTION)]
        t += 5_000
    ev.append(("Optimizer.step#SGD.step", ostart, t, SCOPE_USER))
    return ev, t + 2_000


def large_session(n_events: int = 1_000_000, layers: int = 24):
    """An analysed session of about ``n_events`` events (steps of a synthetic MLP)."""
    template, step_ns = _step_template(layers)
    per_step = len(template) + 1
    steps = max(1, n_events // per_step)
    names = sorted({name for name, *_ in template})
    names += [f"ProfilerStep#{k}" for k in range(steps)]
    name_id = {n: i for i, n in enumerate(names)}
    base = 10_000_000_000
    t_start = np.array([0] + [s for _, s, _, _ in template], dtype=np.int64)
    t_end = np.array([step_ns] + [e for _, _, e, _ in template], dtype=np.int64)
    t_scope = np.array([SCOPE_USER] + [sc for *_, sc in template], dtype=np.uint8)
    t_name = np.array([0] + [name_id[n] for n, *_ in template], dtype=np.int32)
    offsets = base + np.arange(steps, dtype=np.int64) * step_ns
    rec = np.zeros(steps * per_step, dtype=RECORD_DTYPE)
    rec["start_ns"] = (offsets[:, None] + t_start[None, :]).ravel()
    rec["end_ns"] = (offsets[:, None] + t_end[None, :]).ravel()
    names_grid = np.tile(t_name, (steps, 1))
    names_grid[:, 0] = len(names) - steps + np.arange(steps)
    rec["name_id"] = names_grid.ravel()
    rec["scope"] = np.tile(t_scope, steps)
    rec["seq_nr"] = -1
    rec["rf_thread_id"] = 1
    rec["input_offset"] = NO_INPUTS
    rec["thread_index"] = np.where(np.arange(steps) % 10 == 9, 1, 0).repeat(per_step)
    raw = RawSession(rec, [np.zeros(0, np.int64)] * 2, [101, 202], names, base,
                     base + steps * step_ns, 1_700_000_000_000_000_000, process_id=7)
    return build_session(raw, options={k: False for k in OPTION_NAMES})


def training_profile(steps: int = 4, **options):
    """A real profile of MLP train steps under a schedule (ProfilerStep#N ranges)."""
    step = mlp_step_fn()
    step()
    sched = opscope.schedule(wait=0, warmup=1, active=steps - 1, repeat=1)
    with opscope.profile(schedule=sched, **options) as prof:
        for _ in range(steps):
            with opscope.record_function("train_step"):
                step()
            prof.step()
    return prof


@functools.lru_cache(maxsize=1)
def large_report() -> tuple:
    """(path, session) of the report of ``large_session()``, built once per test run."""
    from opscope.report import write_report

    session = large_session()
    folder = tempfile.mkdtemp(prefix="opscope-large-report-")
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, "large.html")
    write_report(session, path)
    return path, session
