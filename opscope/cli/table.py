"""``opscope table TRACE``: the key_averages table of a saved trace or a store.

TRACE is a trace written by opscope or torch.profiler (``.json`` or
``.json.gz``), a folder written by ``tensorboard_trace_handler`` (its newest
trace), or an opscope store. The table is the one ``prof.key_averages().table()``
prints for the live profile, rebuilt from the file. For a store the rows are
aggregated in DuckDB (``opscope.store.aggregate_sql``), so no session of the
store is built; ``--rank``/``--window`` choose its windows (default: the lowest
rank's newest window; ``all`` adds them up). ``--group-by module`` loads the one
window it reads.

Example::

    $ opscope table out/train.pt.trace.json --sort cpu_time_total --limit 10
    $ opscope table out/ --group-by stack:3
    $ opscope table job.store --rank 3 --window all
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple, Optional

from opscope.analysis.facts import shapes_recorded
from opscope.cli.errors import UsageError
from opscope.cli.options import (DEFAULT_ROW_LIMIT, DEFAULT_SORT, add_max_trace_size,
                                 add_memory_limit, parse_row_limit, parse_sort_key)
from opscope.cli.progress import progress
from opscope.cli.terminal import write_text
from opscope.cli.traces import (add_window_options, check_no_window_options, chosen_windows,
                                is_store, load_store_window, load_trace, memory_budget,
                                open_store, store_errors, store_label)
from opscope.model.session import ProfileSession

SUMMARY = "print the key_averages table of a saved trace (opscope or torch.profiler) or a store"
DESCRIPTION = """\
Load TRACE (a .json or .json.gz trace written by opscope or torch.profiler, or
a folder written by tensorboard_trace_handler, whose newest trace is used) and
print its key_averages table, as prof.key_averages().table() prints it. TRACE
may be an opscope store: the table is aggregated in DuckDB over the window that
--rank/--window choose (default: the lowest rank's newest window), or over
several added up ('all'), rows in order of their first event."""
GROUP_BY_FORM = "shape|stack:N|module|graph"


class GroupBy(NamedTuple):
    """What rows are grouped by besides the name: ``shape``, ``stack`` (N frames), ``module``
    or ``graph`` (one row per torch.compile'd graph: ``analysis.compiled_graphs``)."""

    kind: str
    frames: int = 0


def parse_group_by(text: str) -> GroupBy:
    """Parse ``shape``, ``stack:N`` (N >= 1), ``module`` or ``graph``.

    >>> parse_group_by("stack:3"), parse_group_by("module").kind
    (GroupBy(kind='stack', frames=3), 'module')
    >>> parse_group_by("stack")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected shape, stack:N (N >= 1 frames), module or graph; got 'stack'
    """
    kind, _, count = text.partition(":")
    if kind in ("shape", "shapes", "module", "modules", "graph", "graphs") and not count:
        return GroupBy(kind.rstrip("s"))
    if kind == "stack" and count.isdigit() and int(count) >= 1:
        return GroupBy("stack", int(count))
    raise argparse.ArgumentTypeError(
        f"expected shape, stack:N (N >= 1 frames), module or graph; got {text!r}")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``table`` verb."""
    parser = subparsers.add_parser("table", help=SUMMARY, description=DESCRIPTION,
                                   allow_abbrev=False)
    parser.add_argument("trace", metavar="TRACE",
                        help="trace file (.json, .json.gz), trace folder or store")
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
             "Python frames (stack:N), or per nn.Module as a tree (module). CPU Mem is the "
             "bytes allocated minus freed while an op ran, what it called included; a module's "
             "Net CPU Mem is that of its forward and backward ops, so it differs from the CPU "
             "Mem of the module's range, which counts the forward only")
    add_window_options(parser)
    add_max_trace_size(parser)
    add_memory_limit(parser)
    parser.set_defaults(handler=main)


class TableData(NamedTuple):
    """What a trace (or a store's windows) recorded, as the table's checks ask it."""

    shapes: bool
    stacks: bool
    modules: bool
    flops: bool
    memory: bool


def session_data(session: ProfileSession) -> TableData:
    """What ``session`` recorded."""
    return TableData(shapes_recorded(session), bool(session.stacks and any(session.stacks)),
                    bool(session.modules), session.flops is not None,
                    session.event_memory is not None)


def check_group_data(has: TableData, group_by: Optional[GroupBy], where: str) -> None:
    """Raise :class:`UsageError` when the trace lacks what ``group_by`` groups by.

    ``where`` names it: ``trace 'x.json'`` or ``store 's' (rank 0, window 1 (step1))``.
    """
    if group_by is None:
        return
    if group_by.kind == "shape" and not has.shapes:
        raise UsageError(f"{where} has no input shapes to group by (record with "
                         f"--record-shapes / record_shapes=True)")
    if group_by.kind == "stack" and not has.stacks:
        raise UsageError(f"{where} has no Python stacks to group by (record with "
                         f"--stack / with_stack=True)")
    if group_by.kind == "module" and not has.modules:
        raise UsageError(f"{where} has no module data (record with --modules / "
                         f"with_modules=True)")


def check_sort_data(has: TableData, sort: Optional[str], where: str) -> None:
    """Raise :class:`UsageError` when ``sort`` is a column the trace has no data for.

    Sorting by FLOPs or memory that were not recorded would order nothing and
    say nothing; the table would look sorted when it is not.
    """
    if sort is None:
        return
    if "flops" in sort and not has.flops:
        raise UsageError(f"argument --sort: {where} has no FLOPs to sort by "
                         f"(record with --flops / with_flops=True)")
    if "memory" in sort and not has.memory:
        raise UsageError(f"argument --sort: {where} has no memory to sort by "
                         f"(record with --memory / profile_memory=True)")


def session_table(session: ProfileSession, *, sort: Optional[str] = None,
                  row_limit: int = DEFAULT_ROW_LIMIT, group_by: Optional[GroupBy] = None) -> str:
    """The table ``opscope table`` prints for ``session``.

    Ops: ``key_averages`` rows (with the session's memory and FLOPs) in torch's table;
    modules: the module tree of ``opscope.analysis.modules``.
    """
    from opscope.analysis.aggregate import session_key_averages
    from opscope.event_list import ModuleList

    options = session.options
    if group_by is not None and group_by.kind == "graph":
        from opscope.analysis.compiled_frames import frame_rows
        from opscope.analysis.compiled_graphs import graph_breaks, graph_rows
        from opscope.export.graph_table import format_graph_table

        return format_graph_table(graph_rows(session), graph_breaks(session),
                                  frame_rows(session))
    if group_by is not None and group_by.kind == "module":
        from opscope.analysis.modules import fused_kernel_counts, module_rows

        rows = ModuleList(module_rows(session), with_flops=bool(options.get("with_flops")),
                          fused_kernels=fused_kernel_counts(session))
        return rows.table(sort_by=sort, row_limit=row_limit)
    rows = session_key_averages(
        session, group_by_input_shape=group_by is not None and group_by.kind == "shape",
        group_by_stack_n=group_by.frames if group_by is not None else 0)
    return rows_table(rows, options, sort=sort, row_limit=row_limit)


def rows_table(rows: list, options: dict, *, sort: Optional[str] = None,
               row_limit: int = DEFAULT_ROW_LIMIT) -> str:
    """key_averages ``rows`` as torch's table, with memory and FLOPs columns as ``options`` say.

    >>> rows_table([], {})
    ''
    """
    from opscope.event_list import EventList

    return EventList(rows, profile_memory=bool(options.get("profile_memory")),
                     with_flops=bool(options.get("with_flops"))).table(
        sort_by=sort or DEFAULT_SORT, row_limit=row_limit)


def check_sort(sort: Optional[str], group_by: Optional[GroupBy]) -> None:
    """Raise :class:`UsageError` naming --sort when the table cannot sort by ``sort``."""
    if sort is None:
        return
    if group_by is not None and group_by.kind == "graph":
        raise UsageError("argument --sort: the graph table is in the order the graphs first "
                         "ran; use no --sort with --group-by graph")
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


def print_session_table(args: argparse.Namespace, session: ProfileSession, where: str) -> int:
    """Check the data, then print ``session``'s table (or say it has no ops); return 0."""
    has = session_data(session)
    check_group_data(has, args.group_by, where)
    check_sort_data(has, args.sort, where)
    if len(session.table) == 0:
        write_text(f"opscope: {where} has no CPU op events\n", sys.stderr)
        return 0
    with progress("analysing"):
        text = session_table(session, sort=args.sort, row_limit=args.row_limit,
                             group_by=args.group_by)
    write_text(text if text.endswith("\n") else text + "\n")  # names escaped, as all CLI text
    return 0


def store_main(args: argparse.Namespace) -> int:
    """The table of a store's chosen windows, aggregated in DuckDB; return 0."""
    from opscope.store.aggregate_sql import store_key_averages
    from opscope.store.budget import check_memory
    from opscope.store.session_sql import chosen_options, recorded, windows_need

    con = open_store(args.trace, args.memory_limit)
    windows = chosen_windows(con, args, args.trace)
    where = store_label(args.trace, windows)
    limit = memory_budget(args)
    if args.group_by is not None and args.group_by.kind in ("module", "graph"):
        if len(windows) != 1:
            raise UsageError(f"argument --group-by: the {args.group_by.kind} table reads one "
                             f"window; "
                             f"{where}: choose one with --rank and --window")
        return print_session_table(args, load_store_window(args.trace, windows[0], limit),
                                   where)
    options = chosen_options(windows)
    with store_errors(args.trace):  # DuckDB adds the windows up: their rows at once
        check_memory(where, windows_need(con, args.trace, windows), limit)
    with store_errors(args.trace), progress("analysing"):
        found = recorded(con, windows)
        has = TableData(options["record_shapes"] or found.inputs, found.stacks, False,
                       found.flops, found.memory)
        check_group_data(has, args.group_by, where)
        check_sort_data(has, args.sort, where)
        if found.events == 0:
            write_text(f"opscope: {where} has no CPU op events\n", sys.stderr)
            return 0
        rows = store_key_averages(
            con, [(w.rank, w.window) for w in windows],
            group_by_input_shape=args.group_by is not None and args.group_by.kind == "shape",
            group_by_stack_n=args.group_by.frames if args.group_by is not None else 0,
            store=args.trace)
        text = rows_table(rows, options, sort=args.sort, row_limit=args.row_limit)
    write_text(text if text.endswith("\n") else text + "\n")
    return 0


def main(args: argparse.Namespace) -> int:
    """Load the trace (or open the store) and print its table; return the exit status."""
    check_sort(args.sort, args.group_by)
    if is_store(args.trace):
        return store_main(args)
    check_no_window_options(args, args.trace)
    session = load_trace(args.trace, args.max_trace_size)
    return print_session_table(args, session, f"trace {session.source_path!r}")
