"""``opscope table TRACE``: the key_averages table of a saved trace.

TRACE is a trace written by opscope or torch.profiler (``.json`` or
``.json.gz``), or a folder written by ``tensorboard_trace_handler`` (its newest
trace). The table is the one ``prof.key_averages().table()`` prints for the
live profile, rebuilt from the file.

Example::

    $ opscope table out/train.pt.trace.json --sort cpu_time_total --limit 10
    $ opscope table out/ --group-by stack:3
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple, Optional

from opscope.analysis.facts import shapes_recorded
from opscope.cli.errors import UsageError
from opscope.cli.options import (DEFAULT_ROW_LIMIT, DEFAULT_SORT, add_max_trace_size,
                                 parse_row_limit, parse_sort_key)
from opscope.cli.progress import progress
from opscope.cli.terminal import write_text
from opscope.cli.traces import load_trace
from opscope.model.session import ProfileSession

SUMMARY = "print the key_averages table of a saved trace (opscope or torch.profiler)"
DESCRIPTION = """\
Load TRACE (a .json or .json.gz trace written by opscope or torch.profiler, or
a folder written by tensorboard_trace_handler, whose newest trace is used) and
print its key_averages table, as prof.key_averages().table() prints it."""
GROUP_BY_FORM = "shape|stack:N|module"


class GroupBy(NamedTuple):
    """What rows are grouped by besides the name: ``shape``, ``stack`` (N frames) or ``module``."""

    kind: str
    frames: int = 0


def parse_group_by(text: str) -> GroupBy:
    """Parse ``shape``, ``stack:N`` (N >= 1) or ``module``.

    >>> parse_group_by("stack:3"), parse_group_by("module").kind
    (GroupBy(kind='stack', frames=3), 'module')
    >>> parse_group_by("stack")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected shape, stack:N (N >= 1 frames) or module; got 'stack'
    """
    kind, _, count = text.partition(":")
    if kind in ("shape", "shapes", "module", "modules") and not count:
        return GroupBy(kind.rstrip("s"))
    if kind == "stack" and count.isdigit() and int(count) >= 1:
        return GroupBy("stack", int(count))
    raise argparse.ArgumentTypeError(
        f"expected shape, stack:N (N >= 1 frames) or module; got {text!r}")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``table`` verb."""
    parser = subparsers.add_parser("table", help=SUMMARY, description=DESCRIPTION,
                                   allow_abbrev=False)
    parser.add_argument("trace", metavar="TRACE", help="trace file (.json, .json.gz) or folder")
    parser.add_argument(
        "--sort", metavar="KEY",
        help=f"sort by this column, as key_averages().table(sort_by=...) (default: "
             f"{DEFAULT_SORT}; others: cpu_time_total, count, self_cpu_memory_usage, flops, "
             f"...). With --group-by module: a module table column (default: call order)")
    parser.add_argument(
        "--limit", "--row-limit", dest="row_limit", metavar="N", type=parse_row_limit,
        default=DEFAULT_ROW_LIMIT, help=f"rows shown, -1 for all (default: {DEFAULT_ROW_LIMIT})")
    parser.add_argument(
        "--group-by", metavar=GROUP_BY_FORM, type=parse_group_by,
        help="one row per name and input shapes (shape), per name and the N innermost "
             "Python frames (stack:N), or per nn.Module as a tree (module)")
    add_max_trace_size(parser)
    parser.set_defaults(handler=main)


def check_group_data(session: ProfileSession, group_by: Optional[GroupBy], trace: str) -> None:
    """Raise :class:`UsageError` when the trace lacks what ``group_by`` groups by."""
    if group_by is None:
        return
    if group_by.kind == "shape" and not shapes_recorded(session):
        raise UsageError(f"trace {trace!r} has no input shapes to group by (record with "
                         f"--record-shapes / record_shapes=True)")
    if group_by.kind == "stack" and not (session.stacks and any(session.stacks)):
        raise UsageError(f"trace {trace!r} has no Python stacks to group by (record with "
                         f"--stack / with_stack=True)")
    if group_by.kind == "module" and not session.modules:
        raise UsageError(f"trace {trace!r} has no module data (record with --modules / "
                         f"with_modules=True)")


def check_sort_data(session: ProfileSession, sort: Optional[str], trace: str) -> None:
    """Raise :class:`UsageError` when ``sort`` is a column the trace has no data for.

    Sorting by FLOPs or memory that were not recorded would order nothing and
    say nothing; the table would look sorted when it is not.
    """
    if sort is None:
        return
    if "flops" in sort and session.flops is None:
        raise UsageError(f"argument --sort: trace {trace!r} has no FLOPs to sort by "
                         f"(record with --flops / with_flops=True)")
    if "memory" in sort and session.event_memory is None:
        raise UsageError(f"argument --sort: trace {trace!r} has no memory to sort by "
                         f"(record with --memory / profile_memory=True)")


def session_table(session: ProfileSession, *, sort: Optional[str] = None,
                  row_limit: int = DEFAULT_ROW_LIMIT, group_by: Optional[GroupBy] = None) -> str:
    """The table ``opscope table`` prints for ``session``.

    Ops: ``key_averages`` rows (with the session's memory and FLOPs) in torch's table;
    modules: the module tree of ``opscope.analysis.modules``.
    """
    from opscope.analysis.aggregate import session_key_averages
    from opscope.event_list import EventList, ModuleList

    options = session.options
    if group_by is not None and group_by.kind == "module":
        from opscope.analysis.modules import module_rows

        rows = ModuleList(module_rows(session), with_flops=bool(options.get("with_flops")))
        return rows.table(sort_by=sort, row_limit=row_limit)
    rows = session_key_averages(
        session, group_by_input_shape=group_by is not None and group_by.kind == "shape",
        group_by_stack_n=group_by.frames if group_by is not None else 0)
    return EventList(rows, profile_memory=bool(options.get("profile_memory")),
                     with_flops=bool(options.get("with_flops"))).table(
        sort_by=sort or DEFAULT_SORT, row_limit=row_limit)


def check_sort(sort: Optional[str], group_by: Optional[GroupBy]) -> None:
    """Raise :class:`UsageError` naming --sort when the table cannot sort by ``sort``."""
    if sort is None:
        return
    if group_by is not None and group_by.kind == "module":
        from opscope.export.module_table import SORT_KEYS

        if sort not in SORT_KEYS:
            raise UsageError(f"argument --sort: the module table sorts by one of "
                             f"{', '.join(SORT_KEYS)}; got {sort!r}")
        return
    try:
        parse_sort_key(sort)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"argument --sort: {exc}") from None


def main(args: argparse.Namespace) -> int:
    """Load the trace and print its table; return the exit status."""
    check_sort(args.sort, args.group_by)
    session = load_trace(args.trace, args.max_trace_size)
    check_group_data(session, args.group_by, session.source_path)
    check_sort_data(session, args.sort, session.source_path)
    if len(session.table) == 0:
        write_text(f"opscope: trace {session.source_path!r} has no CPU op events\n", sys.stderr)
        return 0
    with progress("analysing"):
        text = session_table(session, sort=args.sort, row_limit=args.row_limit,
                             group_by=args.group_by)
    write_text(text if text.endswith("\n") else text + "\n")  # names escaped, as all CLI text
    return 0
