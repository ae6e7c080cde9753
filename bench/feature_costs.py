"""Per-op and per-allocation costs: the RecordFunction machinery, opscope's own
collection, profile_memory per allocation, and with_stack per op at stack depth 30.

Per op (a loop of ``torch.add`` on 2-element tensors): the machinery is an empty
RecordFunction observer minus the unprofiled loop (bench/empty_observer.py), and
opscope's own work is its profiled loop minus the empty observer, with and without
``record_shapes`` (the empty observer then asks for inputs too).

profile_memory: a loop of ``torch.empty(64)`` (one op, one allocation, one free per
iteration) profiled with and without ``profile_memory``; the cost per allocator report
is the time difference over the reports recorded. with_stack: ``torch.add`` on 2-element
tensors called 30 Python frames deep, profiled with and without ``with_stack``; the cost
is the difference per op. torch.profiler runs the same loops, interleaved, for comparison
(its with_stack records a Python stack only in its experimental verbose mode).

    python bench/feature_costs.py [--quick] [--json PATH] [--reps N] [-n N]
"""

from __future__ import annotations

import contextlib
import time

import common
from empty_observer import empty_observer

N, N_QUICK = 20_000, 2_000
DEPTH = 30


def alloc_loop(n: int):
    import torch

    def body():
        for _ in range(n):
            torch.empty(64)
    return body


def deep_add_loop(n: int, depth: int = DEPTH):
    import torch

    a, b = torch.ones(2), torch.ones(2)

    def recurse(depth: int):
        if depth == 0:
            for _ in range(n):
                torch.add(a, b)
            return
        recurse(depth - 1)

    return lambda: recurse(max(depth - 3, 0))  # the loop, recurse's callers, this lambda


def profiled(profile_cls, body, **options):
    """Time ``body`` inside ``profile_cls(**options)`` (any context manager factory)."""
    def run() -> float:
        with profile_cls(**options):
            t0 = time.perf_counter()
            body()
            return time.perf_counter() - t0
    return run


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, help="repetitions (default 41, 1 with --quick)")
    p.add_argument("-n", type=int, help=f"loop iterations (default {N:,})")
    args = common.parse_args(p)
    import torch.profiler

    import opscope

    common.prepare_opscope()
    n = args.n or (N_QUICK if args.quick else N)
    reps = args.reps or (1 if args.quick else 41)
    alloc, deep = alloc_loop(n), deep_add_loop(n)
    add = deep_add_loop(n, depth=1)
    variants = {
        "add unprofiled": profiled(contextlib.nullcontext, add),
        "add empty observer": profiled(empty_observer, add, needs_inputs=False),
        "add empty observer +inputs": profiled(empty_observer, add, needs_inputs=True),
        "opscope add": profiled(opscope.profile, add),
        "opscope add +shapes": profiled(opscope.profile, add, record_shapes=True),
        "torch add": profiled(torch.profiler.profile, add),
        "opscope alloc": profiled(opscope.profile, alloc),
        "opscope alloc +memory": profiled(opscope.profile, alloc, profile_memory=True),
        "torch alloc": profiled(torch.profiler.profile, alloc),
        "torch alloc +memory": profiled(torch.profiler.profile, alloc, profile_memory=True),
        "opscope deep add": profiled(opscope.profile, deep),
        "opscope deep add +stack": profiled(opscope.profile, deep, with_stack=True),
        "torch deep add": profiled(torch.profiler.profile, deep),
        "torch deep add +stack": profiled(torch.profiler.profile, deep, with_stack=True),
    }
    with opscope.profile(profile_memory=True) as prof:
        alloc_loop(100)()
    reports_per_iter = len(prof.session.memory) / 100  # allocation + free
    for v in variants.values():
        v()
    s = common.interleaved(variants, reps)
    med = {k: common.median(v) for k, v in s.items()}
    reports = n * reports_per_iter

    def per(k_on, k_off, count):
        # median of the paired differences: each repetition runs both loops back to
        # back, so slow drifts of a shared machine cancel out
        return common.median([a - b for a, b in zip(s[k_on], s[k_off])]) * 1e6 / count

    mem_us = {who: per(f"{who} alloc +memory", f"{who} alloc", reports)
              for who in ("opscope", "torch")}
    stack_us = {who: per(f"{who} deep add +stack", f"{who} deep add", n)
                for who in ("opscope", "torch")}
    per_op = {
        "RecordFunction machinery (empty observer - unprofiled)":
            per("add empty observer", "add unprofiled", n),
        "opscope's own work, default (opscope - empty observer)":
            per("opscope add", "add empty observer", n),
        "RecordFunction machinery with inputs (empty observer +inputs - unprofiled)":
            per("add empty observer +inputs", "add unprofiled", n),
        "opscope's own work, record_shapes (opscope - empty observer +inputs)":
            per("opscope add +shapes", "add empty observer +inputs", n),
        "torch.profiler, default (torch - unprofiled)": per("torch add", "add unprofiled", n),
    }
    rows = [[name, n, reps, med[name] * 1e3, ""] for name in variants]
    rows += [[name, n, reps, "", cost] for name, cost in per_op.items()]
    targets = [
        common.target("profile_memory: ≤ 0.2 µs per allocation", mem_us["opscope"], 0.2, " µs",
                      f"per allocator report ({reports_per_iter:.0f} per iteration: allocation "
                      f"and free); torch: {mem_us['torch']:.2f} µs"),
        common.target(f"with_stack: ≤ 1 µs per op at stack depth {DEPTH}", stack_us["opscope"],
                      1.0, " µs", f"torch (no stack recorded outside verbose mode): "
                      f"{stack_us['torch']:.2f} µs"),
    ]
    notes = ["Each cost is the median, over repetitions, of the loop time with the option "
             "minus the loop time without it in the same repetition, divided by the allocator "
             "reports (memory) or ops (stack). The loops cost about 1.5 µs per iteration, so "
             "the differences are small against the machine's noise: many short repetitions.",
             "The per-op rows split profiling's cost on a tiny op into what torch's "
             "RecordFunction machinery costs with an observer that records nothing, and "
             "what opscope's callbacks add on top; the machinery is the floor of the "
             "overhead targets."]
    common.finish({"title": "profile_memory and with_stack costs",
                   "command": common.command_line("feature_costs.py"),
                   "machine": common.machine_info(),
                   "columns": ["variant", "iterations", "reps", "loop ms (median)",
                               "µs per op (median of paired differences)"],
                   "rows": rows, "targets": targets, "notes": notes, "raw": s}, args)


if __name__ == "__main__":
    main()
