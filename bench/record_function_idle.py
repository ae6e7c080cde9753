"""record_function while no profiler records: cost of one ``with record_function(name):``.

Times ``for _ in range(n): with record_function("step"): pass`` for opscope and
torch.profiler, and the same loop with an empty body as the baseline, in rotating order.
The cost per enter/exit is (loop - empty loop) / n, and includes constructing the object,
as user code does.

    python bench/record_function_idle.py [--quick] [--json PATH] [--reps N] [-n N]
"""

from __future__ import annotations

import time

import common

N, N_QUICK = 100_000, 5_000


def loop_of(rf, n: int):
    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            with rf("step"):
                pass
        return time.perf_counter() - t0
    return run


class PlainContext:
    """The least a context manager written in Python can do: three empty methods.

    Its cost is the floor for any Python ``record_function`` (object creation,
    ``__enter__`` and ``__exit__`` are three Python calls)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def empty_loop(n: int):
    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            pass
        return time.perf_counter() - t0
    return run


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, help="repetitions (default 7, 1 with --quick)")
    p.add_argument("-n", type=int, help=f"enter/exit pairs per repetition (default {N:,})")
    args = common.parse_args(p)
    import torch.profiler

    import opscope

    common.prepare_opscope()
    n = args.n or (N_QUICK if args.quick else N)
    reps = args.reps or (1 if args.quick else 7)
    variants = {"empty loop": empty_loop(n),
                "torch": loop_of(torch.profiler.record_function, n),
                "opscope": loop_of(opscope.record_function, n),
                "plain Python context manager": loop_of(PlainContext, n)}
    for v in variants.values():
        v()
    s = common.interleaved(variants, reps)
    base = common.median(s["empty loop"])
    names = ("torch", "opscope", "plain Python context manager")
    us = {k: (common.median(s[k]) - base) * 1e6 / n for k in names}
    rows = [[name, n, reps, common.median(s[name]) * 1e3, us[name]] for name in names]
    rows.append(["empty loop (baseline)", n, reps, base * 1e3, ""])
    targets = [common.target("opscope.record_function idle: ≤ 0.3 µs per enter/exit",
                             us["opscope"], 0.3, " µs", f"torch: {us['torch']:.2f} µs; "
                             f"opscope/torch {us['opscope'] / us['torch']:.3f}; a plain "
                             f"Python context manager: "
                             f"{us['plain Python context manager']:.3f} µs")]
    notes = ["No profiler is running. µs per enter/exit is net of the empty loop.",
             "'plain Python context manager' is a class with an empty __init__, __enter__ "
             "and __exit__ (PlainContext in this script): what three Python calls cost "
             "on this machine, the floor for a record_function written in Python."]
    common.finish({"title": "record_function with no profiler recording",
                   "command": common.command_line("record_function_idle.py"),
                   "machine": common.machine_info(),
                   "columns": ["record_function", "pairs", "reps", "loop ms (median)",
                               "µs per enter/exit"],
                   "rows": rows, "targets": targets, "notes": notes, "raw": s}, args)


if __name__ == "__main__":
    main()
