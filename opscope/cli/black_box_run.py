"""``opscope run --black-box [--black-box-seconds N] SCRIPT``: the script under the black box.

Instead of profiling, the script runs with ``opscope.blackbox`` on: the last
N seconds (default 30) of every op are kept, and written under the ``-o``
folder when something goes wrong (an uncaught exception, SIGTERM or SIGINT,
a slow step, a stall, ``opscope trigger PID --black-box``). What was written
is listed at the end, one line each.

Example::

    $ opscope run --black-box -o out train.py
    opscope: black box: wrote out/train.blackbox.exception.1718000000000.pt.trace.json.gz
"""

from __future__ import annotations

import argparse
import os
import sys

from opscope.cli.profiling import profile_kwargs, warm_up_collector
from opscope.script import run_script

DEFAULT_SECONDS = 30.0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def add_black_box_options(parser: argparse.ArgumentParser) -> None:
    """``--black-box`` and ``--black-box-seconds``."""
    group = parser.add_argument_group("black box (instead of profiling)")
    group.add_argument("--black-box", action="store_true",
                       help="run under opscope.blackbox: keep the last seconds of every op "
                            "and write them to DIR only when something goes wrong")
    group.add_argument("--black-box-seconds", metavar="N", type=_seconds,
                       default=DEFAULT_SECONDS,
                       help=f"seconds the black box keeps (default: {DEFAULT_SECONDS:g})")


def run_with_black_box(args: argparse.Namespace, folder: str) -> int:
    """Run the script with the black box on; the script's exit status."""
    import opscope

    from opscope.black_box.box import OPTION_NAMES

    options = {k: v for k, v in profile_kwargs(args).items() if k in OPTION_NAMES}
    box = opscope.blackbox(dir=folder, seconds=args.black_box_seconds, **options)
    box.script, box.yields = args.script, True
    warm_up_collector()
    box.start()
    try:
        outcome = run_script(args.script, args.script_args)
        outcome.report()  # an uncaught exception goes through the black box's excepthook
    finally:
        box.stop()
    for path in box.dumps:
        if os.path.isfile(path):
            print(f"opscope: black box: wrote {path}", file=sys.stderr)
    return outcome.exit_code
