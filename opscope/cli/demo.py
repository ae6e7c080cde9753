"""``opscope demo``: profile a small built-in model, no downloads needed.

A tiny transformer block (attention plus MLP, from ``torch.nn``) trains on
random data with SGD for ``--steps`` steps under
``schedule(wait=1, warmup=1, active=steps-2, repeat=1)`` with every option
on (``DEMO_OPTIONS``: shapes, memory, stacks, FLOPs, modules), so each view of
the report has data; the table is printed, the trace written as ``DIR/demo.pt.trace.json`` and the HTML report
as ``DIR/demo.html``.

Example::

    $ opscope demo -o out --steps 5
"""

from __future__ import annotations

import argparse
import sys

from opscope.cli.options import ScheduleSpec, add_output_dir, prepare_output_dir
from opscope.cli.profiling import make_schedule, start_profiler, warm_up_collector
from opscope.cli.results import OUTPUTS, REPORT, WindowWriter, print_summary, print_table


def __getattr__(name: str):
    """``TinyBlock`` and ``train`` live in ``demo_model`` (it imports torch; this does not)."""
    if name in ("TinyBlock", "train"):
        from opscope.cli import demo_model

        return getattr(demo_model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

SUMMARY = "profile a tiny built-in model training for a few steps"
DEFAULT_STEPS = 5
WAIT, WARMUP = 1, 1
STEM = "demo"
DEMO_OPTIONS = {"record_shapes": True, "profile_memory": True, "with_stack": True,
                "with_flops": True, "with_modules": True}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``demo`` verb."""
    parser = subparsers.add_parser(
        "demo", help=SUMMARY, allow_abbrev=False,
        description=f"{SUMMARY}: a tiny transformer block on random data with SGD, profiled "
                    f"with schedule(wait={WAIT}, warmup={WARMUP}, active=STEPS-2, repeat=1). "
                    f"Prints the table and writes DIR/{STEM}.pt.trace.json and the HTML report "
                    f"DIR/{STEM}.html.")
    add_output_dir(parser, "the trace and the report")
    parser.add_argument("--steps", metavar="N", type=_steps, default=DEFAULT_STEPS,
                        help=f"training steps, at least 3 (default: {DEFAULT_STEPS}); the first "
                             f"waits, the second warms up, the rest are recorded")
    parser.set_defaults(handler=main)


def _steps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < WAIT + WARMUP + 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= {WAIT + WARMUP + 1}; got {text!r}")
    return value


def main(args: argparse.Namespace) -> int:
    """Run the demo; return the exit status."""
    import opscope
    from opscope.cli.demo_model import train

    folder = prepare_output_dir(args.output_dir)
    writer = WindowWriter(folder, args.output_dir, STEM, by_step=False,
                          outputs=OUTPUTS + [REPORT])
    spec = ScheduleSpec(WAIT, WARMUP, args.steps - WAIT - WARMUP, repeat=1)
    prof = opscope.profile(schedule=make_schedule(spec), on_trace_ready=writer, **DEMO_OPTIONS)
    warm_up_collector()
    start_profiler(prof)
    try:
        train(args.steps, prof.step)
    finally:
        writer.stopping = True
        prof.stop()
    shown = writer.shown_window()
    if shown is None or not print_table(shown, sort="self_cpu_time_total", row_limit=20,
                                        label=shown.label):
        print("opscope: error: the demo recorded nothing", file=sys.stderr)
        return 1
    print_summary(writer)
    return 1 if writer.errors else 0
