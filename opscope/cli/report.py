"""``opscope report TRACE [-o report.html]``: the HTML report of a saved trace.

TRACE is a trace written by opscope or torch.profiler (``.json`` or
``.json.gz``), or a folder written by ``tensorboard_trace_handler`` (its
newest trace is used). The report is one self-contained HTML file. A folder
holding the per-rank traces of a torch.distributed job (two ranks or more) gives
the job's report: a Ranks view (step times per rank, collectives, stragglers,
desync, a timeline per rank) and the other views of the lowest rank.
TRACE may be an opscope store: a store of one rank gives the report of one
window (``--rank``/``--window``; default: the newest), read back as a session;
a store of two ranks or more gives the job's report, its ranks read from the
store (``opscope.store.ranks_sql.load_store_job``), one window at a time. The
page goes beside the store (``job.store`` -> ``job.store.html``) unless -o says.

Example::

    $ opscope report out/demo.pt.trace.json -o demo.html
    $ opscope report out/ranks/            # writes out/ranks/ranks.html
    $ opscope report job.store             # writes job.store.html
"""

from __future__ import annotations

import argparse
import os
import sys

from opscope.cli.errors import UsageError
from opscope.cli.options import add_max_trace_size, add_memory_limit
from opscope.cli.progress import progress
from opscope.cli.terminal import terminal_safe, write_text
from opscope.cli.traces import (add_window_options, check_no_window_options, chosen_windows,
                                is_store, load_store_window, memory_budget, open_store,
                                store_errors)

SUMMARY = "write the HTML report of a saved trace (opscope or torch.profiler)"
DESCRIPTION = """\
Load TRACE (a .json or .json.gz trace written by opscope or torch.profiler, or
a folder written by tensorboard_trace_handler, whose newest trace is used) and
write one self-contained HTML file: step overview, operators, modules, flame
graph, timeline, memory and recommendations. It opens offline in any browser.
When TRACE is a folder of a distributed job's per-rank traces (two ranks or
more, named by distributedInfo.rank or rank<R> in the file name), the report
is the job's: a Ranks view with step time per rank and step, the collectives
matched across ranks, the stragglers and desync, and a timeline per rank on
aligned clocks; the other views show the lowest rank (default output:
DIR/ranks.html). TRACE may be an opscope store: one window's report (chosen
with --rank/--window; default: the lowest rank's newest), or with two ranks
or more and no --rank/--window the job's report (default output: STORE.html
beside the store)."""
TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")
JOB_REPORT_NAME = "ranks.html"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``report`` verb."""
    parser = subparsers.add_parser("report", help=SUMMARY, description=DESCRIPTION,
                                   allow_abbrev=False)
    parser.add_argument("trace", metavar="TRACE", help="trace file, trace folder or store")
    parser.add_argument(
        "-o", "--output", metavar="FILE",
        help="the HTML file to write, or a folder to write it in (default: beside the "
             "trace, named like it with .html, e.g. demo.pt.trace.json -> demo.html)")
    parser.add_argument("--title", help="title shown in the report (default: the trace's path)")
    add_window_options(parser, one_window=True)
    add_max_trace_size(parser)
    add_memory_limit(parser)
    parser.set_defaults(handler=main)


def default_report_name(trace_file: str) -> str:
    """``demo.pt.trace.json.gz`` -> ``demo.html``.

    >>> default_report_name("/x/w.123.pt.trace.json"), default_report_name("t.json.gz")
    ('w.123.html', 't.html')
    """
    name = os.path.basename(trace_file)
    for suffix in TRACE_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)] + ".html"
    return name + ".html"


def output_path(output: str, trace_file: str) -> str:
    """Where the report goes: ``output``, a file in the folder ``output``, or beside the trace."""
    if not output:
        return os.path.join(os.path.dirname(trace_file), default_report_name(trace_file))
    if os.path.isdir(output):
        return os.path.join(output, default_report_name(trace_file))
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise UsageError(f"argument -o/--output: the folder {folder!r} does not exist")
    return output


def job_traces(folder: str) -> list:
    """The traces of ``folder`` when they name two ranks or more (a job), else []."""
    from opscope.load.ranks import RankTraceError, peek_rank, trace_paths

    if not os.path.isdir(folder):
        return []
    try:
        paths = trace_paths(folder)
    except RankTraceError:
        return []
    ranks = {peek_rank(p) for p in paths} - {None}
    return paths if len(ranks) >= 2 else []


def write_job(args: argparse.Namespace, paths: list) -> int:
    """Write the job report of the rank traces ``paths`` in the folder ``args.trace``."""
    from opscope.load.ranks import RankTraceError
    from opscope.load import TraceLoadError
    from opscope.report import write_job_report

    folder = args.trace
    if not args.output or os.path.isdir(args.output):
        target = os.path.join(args.output or folder, JOB_REPORT_NAME)
    else:
        target = output_path(args.output, folder)
    try:
        with progress(f"writing {terminal_safe(target)} from {len(paths)} rank traces"):
            write_job_report(paths, target, title=args.title or folder,
                             max_bytes=args.max_trace_size)
    except (RankTraceError, TraceLoadError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    except MemoryError:
        raise UsageError(f"{folder!r}: not enough memory to load its traces") from None
    except OSError as exc:
        raise UsageError(f"argument -o/--output: cannot write {target!r} "
                         f"({exc.strerror or exc})") from None
    write_text(f"opscope: wrote report {target} (open it in a browser)\n", sys.stderr)
    return 0


def store_output(output: str, store: str) -> str:
    """Where a store's report goes: ``output`` (file or folder), else ``STORE.html`` beside it.

    >>> store_output("", "/x/job.store/")
    '/x/job.store.html'
    """
    name = os.path.basename(os.path.normpath(store)) + ".html"
    if not output:
        return os.path.join(os.path.dirname(os.path.abspath(os.path.normpath(store))), name)
    if os.path.isdir(output):
        return os.path.join(output, name)
    return output_path(output, store)


def write_store(args: argparse.Namespace) -> int:
    """Write a store's report: the job's (two ranks or more, no window chosen) or a window's."""
    from opscope.load.ranks import RankTraceError
    from opscope.report import write_report, write_report_data
    from opscope.report.data import job_data
    from opscope.store.ranks_sql import load_store_job
    from opscope.store.session_sql import check_rank_memory, store_windows

    store = args.trace
    target = store_output(args.output, store)
    con = open_store(store, args.memory_limit)
    limit = memory_budget(args)
    with store_errors(store):
        every = store_windows(con)
    if len({w.rank for w in every}) >= 2 and args.rank is None and args.window is None:
        with store_errors(store), progress(f"writing {terminal_safe(target)} from "
                                           f"{len(every)} windows"):
            check_rank_memory(con, store, limit)  # then each window, as it is loaded
            try:
                data = job_data(lambda visit: load_store_job(store, con, visit, limit),
                                len(every), title=args.title or store)
            except RankTraceError as exc:  # ranks or times out of bounds in the store's rows
                raise UsageError(str(exc)) from None
            write_report_data(data, target)
    else:
        windows = chosen_windows(con, args, store)
        if len(windows) != 1:
            raise UsageError(f"store {store!r}: the report shows one window; choose one with "
                             f"--rank and --window (not 'all')")
        session = load_store_window(store, windows[0], limit)
        with store_errors(store), progress(f"writing {terminal_safe(target)}"):
            write_report(session, target, title=args.title or f"{store} ({windows[0].label})")
    write_text(f"opscope: wrote report {target} (open it in a browser)\n", sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    """Load the trace and write its report; return the exit status."""
    from opscope.analysis.build import load_session
    from opscope.load import TraceLoadError, resolve_trace_path
    from opscope.report import write_report

    if is_store(args.trace):
        try:
            return write_store(args)
        except OSError as exc:
            raise UsageError(f"argument -o/--output: cannot write the report "
                             f"({exc.strerror or exc})") from None
    check_no_window_options(args, args.trace)
    paths = job_traces(args.trace)
    if paths:
        return write_job(args, paths)
    try:
        trace_file = resolve_trace_path(args.trace)
        target = output_path(args.output, trace_file)
        with progress(f"loading {terminal_safe(trace_file)}"):
            session = load_session(trace_file, max_bytes=args.max_trace_size)
    except TraceLoadError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # a bad OPSCOPE_MAX_TRACE_BYTES
        raise UsageError(str(exc)) from None
    except MemoryError:
        raise UsageError(f"trace {trace_file!r}: not enough memory to load it (lower "
                         f"--max-trace-size to refuse such files quickly)") from None
    try:
        with progress(f"writing {terminal_safe(target)}"):
            write_report(session, target, title=args.title or trace_file)
    except OSError as exc:
        raise UsageError(f"argument -o/--output: cannot write {target!r} "
                         f"({exc.strerror or exc})") from None
    write_text(f"opscope: wrote report {target} (open it in a browser)\n", sys.stderr)
    return 0
