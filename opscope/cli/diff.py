"""``opscope diff A B [-o diff.html]``: what changed between two saved traces.

A is the baseline, B the new run; each is a trace written by opscope or
torch.profiler (``.json``/``.json.gz``), a ``tensorboard_trace_handler``
folder or an opscope store. A store's ops are aggregated in DuckDB
(``opscope.store.aggregate_sql.store_diff_side``) over the windows
``--rank``/``--window`` choose; its modules are compared when one window is
chosen and both sides recorded modules. Ops (and modules, when both recorded them) are listed by absolute
change of self CPU time, regressions marked; ``-o`` also writes the diff as
a self-contained HTML page, with the modules by call path (``--group-by module``'s rows)
when both sides have them.

Example::

    $ opscope diff before.pt.trace.json after.pt.trace.json -o diff.html
"""

from __future__ import annotations

import argparse
import os
import sys

from opscope.cli.errors import UsageError
from opscope.cli.options import add_max_trace_size, parse_row_limit
from opscope.cli.progress import progress
from opscope.cli.terminal import terminal_safe, write_text
from opscope.cli.traces import (add_window_options, chosen_windows, is_store, load_store_window,
                                load_trace, open_store, store_errors)

# opscope.analysis.diff's defaults, mirrored so that parsing imports no torch (a test checks)
DEFAULT_THRESHOLD_PCT = 10.0
DEFAULT_NOISE_PCT = 1.0
SUMMARY = "compare two saved traces op by op: what got slower, what got faster"
DESCRIPTION = f"""\
Load traces A (the baseline) and B (the new run) and print, per op and per
module (when both traces recorded modules), self CPU time, total CPU time and
calls on each side and the change, ordered by absolute change of self time.
A row is marked REGRESSION when its self time grew by at least --threshold
percent (default {DEFAULT_THRESHOLD_PCT:g}) of what it was and by at least
{DEFAULT_NOISE_PCT:g}% of the total self time (smaller changes are noise);
"improved" is the mirror. When both sides have steps (ProfilerStep#N, else
optimizer.step() calls), times and calls are compared per step, as the output
says. With -o, the diff is also written as an HTML page.
A or B may be an opscope store: its ops are aggregated in DuckDB over the
windows --rank/--window choose (default: the lowest rank's newest window)."""
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
    parser.add_argument("a", metavar="A", help="the baseline trace (file or folder) or store")
    parser.add_argument("b", metavar="B",
                        help="the trace (file or folder) or store to compare with it")
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
    parser.add_argument("--group-by", choices=["module"], default=None,
                        help="module: one row per module call path instead, with both sides' "
                             "forward and backward time and the change (traces, or one window "
                             "of a store, that recorded with_modules; an eager and a "
                             "torch.compile'd trace of one model match module by module; -o's "
                             "page has these rows too)")
    add_window_options(parser)
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


class _Input:
    """One side as given: a loaded trace's session, or a store's connection and windows."""

    def __init__(self, path: str, args: argparse.Namespace):
        self.path = path
        self.session = self.con = None
        self.windows: list = []
        if is_store(path):
            from opscope.store.aggregate_sql import module_names

            self.con = open_store(path)
            self.windows = chosen_windows(self.con, args, path)
            self.name = (f"{path} ({self.windows[0].label})" if len(self.windows) == 1
                         else f"{path} ({len(self.windows)} windows)")
            with store_errors(path):
                self.has_modules = bool(module_names(
                    self.con, [(w.rank, w.window) for w in self.windows]))
        else:
            self.session = load_trace(path, args.max_trace_size)
            self.name = self.session.source_path
            self.has_modules = bool(self.session.modules)
        self._window_session = None

    def module_session(self):
        """The session whose modules are compared: the trace's, or a store's one window's
        (None for a store read over several windows)."""
        if self.session is not None:
            return self.session
        if len(self.windows) != 1:
            return None
        if self._window_session is None:
            self._window_session = load_store_window(self.path, self.windows[0])
        return self._window_session

    def side(self, modules: bool):
        """Its DiffSide; module rows when ``modules`` (and, for a store, one window)."""
        from opscope.analysis.diff import session_side

        if self.session is not None:
            return session_side(self.session, modules)
        from opscope.store.aggregate_sql import store_diff_side

        session = self.module_session() if modules else None
        with store_errors(self.path):
            return store_diff_side(self.con, [(w.rank, w.window) for w in self.windows],
                                   session)


def main(args: argparse.Namespace) -> int:
    """Load both traces (or stores), print the diff, write the HTML page if asked; return 0."""
    from opscope.export.diff_html import write_diff_html
    from opscope.export.diff_text import format_diff

    if args.output:
        check_output(args.output)
    if not (is_store(args.a) or is_store(args.b)):
        from opscope.cli.traces import check_no_window_options

        check_no_window_options(args, args.a)
    a, b = _Input(args.a, args), _Input(args.b, args)
    by_module = getattr(args, "group_by", None) == "module"
    module_rows = _module_rows(a, b, required=by_module) if by_module or args.output else None
    if by_module:
        from opscope.export.module_diff_text import format_module_diff

        write_text(format_module_diff(module_rows, names=(a.name, b.name)) + "\n")
        if not args.output:
            return 0
    both = a.has_modules and b.has_modules
    from opscope.analysis.diff import diff_sides

    with progress("comparing"):
        diff = diff_sides(a.side(both), b.side(both), threshold_pct=args.threshold)
    names = (a.name, b.name)
    if not by_module:
        write_text(format_diff(diff, names=names, row_limit=args.limit) + "\n")
    if args.output:
        try:
            with progress(f"writing {terminal_safe(args.output)}"):
                write_diff_html(diff, args.output, names=names,
                                title=f"opscope diff: {os.path.basename(names[0])} -> "
                                      f"{os.path.basename(names[1])}", module_rows=module_rows)
        except OSError as exc:
            raise UsageError(f"argument -o/--output: cannot write {args.output!r} "
                             f"({exc.strerror or exc})") from None
        write_text(f"opscope: wrote diff {args.output} (open it in a browser)\n", sys.stderr)
    return 0


def _module_rows(a: _Input, b: _Input, *, required: bool):
    """Both sides' modules by call path (``analysis.module_diff``); None when a side has no
    modules or is a store read over several windows, which ``required`` (``--group-by
    module``) makes a usage error."""
    from opscope.analysis.module_diff import module_diff

    for side in (a, b):
        if not side.has_modules:
            if not required:
                return None
            raise UsageError(f"argument --group-by: module: {side.path!r} has no modules "
                             f"(record with with_modules=True)")
        if side.session is None and len(side.windows) != 1:
            if not required:
                return None
            raise UsageError(f"argument --group-by: module: {side.path!r}: expected one "
                             f"window of the store (choose it with --rank and --window); "
                             f"got {len(side.windows)}")
    sessions = (a.module_session(), b.module_session())
    with progress("comparing modules"):
        return module_diff(*sessions)
