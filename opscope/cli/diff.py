"""``opscope diff A B [-o diff.html]``: what changed between two saved traces.

A is the baseline, B the new run; each is a trace written by opscope or
torch.profiler (``.json``/``.json.gz``) or a ``tensorboard_trace_handler``
folder. Ops (and modules, when both recorded them) are listed by absolute
change of self CPU time, regressions marked; ``-o`` also writes the diff as
a self-contained HTML page.

Example::

    $ opscope diff before.pt.trace.json after.pt.trace.json -o diff.html
"""

from __future__ import annotations

import argparse
import os
import sys

from opscope.analysis.diff import DEFAULT_NOISE_PCT, DEFAULT_THRESHOLD_PCT, diff_sessions
from opscope.cli.errors import UsageError
from opscope.cli.options import add_max_trace_size, parse_row_limit
from opscope.cli.progress import progress
from opscope.cli.terminal import terminal_safe, write_text
from opscope.cli.traces import load_trace

SUMMARY = "compare two saved traces op by op: what got slower, what got faster"
DESCRIPTION = f"""\
Load traces A (the baseline) and B (the new run) and print, per op and per
module (when both traces recorded modules), self CPU time, total CPU time and
calls on each side and the change, ordered by absolute change of self time.
A row is marked REGRESSION when its self time grew by at least --threshold
percent (default {DEFAULT_THRESHOLD_PCT:g}) of what it was and by at least
{DEFAULT_NOISE_PCT:g}% of the total self time (smaller changes are noise);
"improved" is the mirror. With -o, the diff is also written as an HTML page."""
DEFAULT_LIMIT = 30


def parse_percent(text: str) -> float:
    """A percentage >= 0.

    >>> parse_percent("5"), parse_percent("2.5")
    (5.0, 2.5)
    """
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0, e.g. 10; got {text!r}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``diff`` verb."""
    parser = subparsers.add_parser("diff", help=SUMMARY, description=DESCRIPTION,
                                   allow_abbrev=False)
    parser.add_argument("a", metavar="A", help="the baseline trace (file or folder)")
    parser.add_argument("b", metavar="B", help="the trace to compare with it (file or folder)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="also write the diff as a self-contained HTML page")
    parser.add_argument("--limit", metavar="N", type=parse_row_limit, default=DEFAULT_LIMIT,
                        help=f"rows per section in the text, -1 for all "
                             f"(default: {DEFAULT_LIMIT}; the HTML page has every row)")
    parser.add_argument("--threshold", metavar="PCT", type=parse_percent,
                        default=DEFAULT_THRESHOLD_PCT,
                        help=f"smallest change of an op's self time, in percent of its old "
                             f"self time, marked as a regression or improvement "
                             f"(default: {DEFAULT_THRESHOLD_PCT:g})")
    add_max_trace_size(parser)
    parser.set_defaults(handler=main)


def check_output(path: str) -> str:
    """Raise :class:`UsageError` naming -o when ``path`` cannot be written; return it."""
    if os.path.isdir(path):
        raise UsageError(f"argument -o/--output: {path!r} is a folder; expected an HTML "
                         f"file name such as diff.html")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"argument -o/--output: the folder {folder!r} does not exist")
    return path


def main(args: argparse.Namespace) -> int:
    """Load both traces, print the diff, write the HTML page if asked; return 0."""
    from opscope.export.diff_html import write_diff_html
    from opscope.export.diff_text import format_diff

    if args.output:
        check_output(args.output)
    a = load_trace(args.a, args.max_trace_size)
    b = load_trace(args.b, args.max_trace_size)
    with progress("comparing"):
        diff = diff_sessions(a, b, threshold_pct=args.threshold)
    names = (a.source_path, b.source_path)
    write_text(format_diff(diff, names=names, row_limit=args.limit) + "\n")
    if args.output:
        try:
            with progress(f"writing {terminal_safe(args.output)}"):
                write_diff_html(diff, args.output, names=names,
                                title=f"opscope diff: {os.path.basename(names[0])} -> "
                                      f"{os.path.basename(names[1])}")
        except OSError as exc:
            raise UsageError(f"argument -o/--output: cannot write {args.output!r} "
                             f"({exc.strerror or exc})") from None
        write_text(f"opscope: wrote diff {args.output} (open it in a browser)\n", sys.stderr)
    return 0
