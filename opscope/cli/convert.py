"""``opscope convert TRACE_OR_DIR... -o STORE [--jobs N]``: saved traces into a store.

Each trace (opscope's or torch.profiler's, ``.json`` or ``.json.gz``; a folder
stands for its traces) is streamed, built, reduced to its rank's facts and
written as one window of its rank, then dropped, so memory holds one trace at
a time however many ranks there are. A missing input, a trace that cannot be
read, or an ``-o`` path that exists and is not a store exits with status 2
and one line; a new store appears only when whole.

Example::

    $ opscope convert job_traces/ -o job.store
    $ opscope query job.store "SELECT rank, count(*) FROM events GROUP BY rank"
"""

from __future__ import annotations

import argparse
import sys

from opscope.cli.errors import UsageError
from opscope.cli.options import at_least_one

SUMMARY = "convert saved traces (opscope or torch.profiler) into an opscope store"
DESCRIPTION = """\
Convert traces (opscope's or torch.profiler's Chrome traces, plain or gzip;
a folder stands for its .json/.json.gz files) into the opscope store STORE,
a folder of Parquet files that opscope query and the ranks and report verbs
read. A trace's rank is distributedInfo.rank, else rank<R> in its file name,
else 0; a rank's traces become its windows in time order. Traces are read in
bounded memory, one at a time. An existing store gets the new windows after
its own; any other existing path is refused."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``convert`` verb."""
    from opscope.cli.options import add_max_trace_size

    parser = subparsers.add_parser("convert", help=SUMMARY, description=DESCRIPTION,
                                   allow_abbrev=False)
    parser.add_argument("traces", metavar="TRACE_OR_DIR", nargs="+",
                        help="trace files, or folders of them")
    parser.add_argument("-o", "--output", metavar="STORE", required=True,
                        help="the store folder to write (new, or an existing store)")
    parser.add_argument("--jobs", metavar="N", default=1,
                        type=at_least_one("a number of processes"),
                        help="processes converting ranks side by side (default: 1); "
                             "each holds one trace's session")
    add_max_trace_size(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Convert; print one summary line on stderr; return 0."""
    from opscope.cli.progress import progress
    from opscope.load import TraceLoadError
    from opscope.store import StoreError
    from opscope.store.convert import convert

    try:
        with progress("converting traces"):
            result = convert(args.traces, args.output, jobs=args.jobs,
                             max_bytes=args.max_trace_size)
    except (StoreError, TraceLoadError) as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # a bad OPSCOPE_MAX_TRACE_BYTES
        raise UsageError(str(exc)) from None
    except MemoryError:
        raise UsageError("not enough memory to convert the traces") from None
    except OSError as exc:
        raise UsageError(f"cannot write store {args.output!r} "
                         f"({exc.strerror or exc})") from None
    ranks = result.ranks
    shown = ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")
    sys.stderr.write(f"opscope: wrote {result.store}: {result.windows} window(s) of "
                     f"{len(ranks)} rank(s) ({shown}), {result.events:,} events\n")
    return 0


main = run
