"""``opscope ranks DIR [--json]``: a torch.distributed job's per-rank traces as one profile.

DIR holds one trace per rank (or several: one per window), written by opscope
or torch.profiler, each naming its rank in ``distributedInfo`` or in its file
name (``train.rank3.pt.trace.json``). DIR may also be an opscope store: the
ranks' facts and collectives are read from its ``sessions`` and ``collectives``
tables with DuckDB (``opscope.store.ranks_sql``), no event is loaded, and the
analysis is the one of the traces it was made from. The report has the
per-rank times, the collectives matched across ranks (those with the longest
wait first), the stragglers and the first desync; ``--json`` prints it as one
JSON document (see ``opscope.analysis.ranks.analyse.RanksAnalysis.to_json``).

Example::

    $ opscope ranks out/
    $ opscope ranks out/ --json | jq .stragglers
    $ opscope ranks job.store --json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from opscope.cli.errors import UsageError
from opscope.cli.options import (add_max_trace_size, add_memory_limit, at_least_one,
                                  parse_row_limit)
from opscope.cli.progress import progress
from opscope.cli.terminal import write_text

SUMMARY = "analyse a distributed job's per-rank traces: collectives, stragglers, desync"
DESCRIPTION = """\
Load the per-rank traces in DIR (opscope's or torch.profiler's; a trace's rank
is distributedInfo.rank, else rank<R> in its file name) and print per rank its
steps, mean step time and time in compute, communication and waiting; the
collectives matched across ranks by (process group, sequence number), with
each rank's arrival, wait and transfer; the stragglers (ranks that arrive
last); and the first desync (where ranks issued different collectives). DIR
may be an opscope store: its ranks are read with DuckDB, all windows."""

# opscope.export.ranks_text's default, mirrored so that parsing imports no torch (a test checks)
DEFAULT_COLLECTIVE_LIMIT = 20

def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``ranks`` verb."""
    from opscope.analysis.ranks.analyse import DEFAULT_MIN_LATENESS_MS

    parser = subparsers.add_parser("ranks", help=SUMMARY, description=DESCRIPTION,
                                   allow_abbrev=False)
    parser.add_argument("folder", metavar="DIR", help="folder of per-rank traces, or a store")
    parser.add_argument("--json", action="store_true",
                        help="print the analysis as one JSON document on stdout")
    parser.add_argument("--limit", metavar="N", type=parse_row_limit,
                        default=DEFAULT_COLLECTIVE_LIMIT,
                        help=f"collectives shown, longest wait first, -1 for all (default: "
                             f"{DEFAULT_COLLECTIVE_LIMIT}; --json has them all)")
    parser.add_argument("--min-lateness-ms", metavar="MS", type=float,
                        default=DEFAULT_MIN_LATENESS_MS,
                        help=f"smallest lateness that makes a rank a straggler at a "
                             f"collective (default: {DEFAULT_MIN_LATENESS_MS:g})")
    parser.add_argument("--jobs", metavar="N", type=at_least_one("a number of processes"),
                        help="processes reading traces side by side (default: the cores, "
                             "at most 8); each holds one trace")
    add_max_trace_size(parser)
    add_memory_limit(parser)
    parser.set_defaults(handler=main)


def load_job(folder: str, max_bytes=None, jobs: Optional[int] = None):
    """``load_ranks(folder)`` in ``jobs`` processes (default: the cores); a missing folder
    or a bad trace is a one-line UsageError."""
    from opscope.analysis.ranks.facts import load_ranks
    from opscope.load.ranks import RankTraceError
    from opscope.load import TraceLoadError
    from opscope.load.parallel import default_jobs

    try:
        with progress("loading rank traces"):
            return load_ranks(folder, max_bytes=max_bytes, jobs=jobs or default_jobs())
    except (RankTraceError, TraceLoadError) as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # a bad OPSCOPE_MAX_TRACE_BYTES
        raise UsageError(str(exc)) from None
    except MemoryError:
        raise UsageError(f"{folder!r}: not enough memory to load its traces") from None


def load_store_facts(store: str, memory_limit: Optional[int] = None,
                     budget: Optional[int] = None):
    """The store's RankFacts (``opscope.store.ranks_sql``); problems are one-line UsageErrors.

    ``memory_limit`` (bytes) is DuckDB's; ``budget`` (bytes) refuses a store whose
    sessions and collectives rows would need more (``session_sql.check_rank_memory``).
    """
    from opscope.cli.traces import open_store, store_errors
    from opscope.store.ranks_sql import store_rank_facts
    from opscope.store.session_sql import check_rank_memory

    con = open_store(store, memory_limit)
    with store_errors(store), progress("reading ranks"):
        check_rank_memory(con, store, budget)
        return store_rank_facts(con, store)


def main(args: argparse.Namespace) -> int:
    """Load the rank traces, analyse them, print text or JSON; return 0."""
    from opscope.analysis.ranks.analyse import analyse_ranks
    from opscope.export.ranks_text import format_ranks

    if not args.min_lateness_ms >= 0:
        raise UsageError(f"argument --min-lateness-ms: expected ms >= 0, got "
                         f"{args.min_lateness_ms!r}")
    from opscope.cli.traces import is_store, memory_budget

    if is_store(args.folder):
        facts = load_store_facts(args.folder, args.memory_limit, memory_budget(args))
    else:
        facts = load_job(args.folder, args.max_trace_size, args.jobs)
    from opscope.load.ranks import RankTraceError

    try:
        with progress("analysing"):  # a store's ranks are checked here (traces': when read)
            analysis = analyse_ranks(facts, min_lateness_ms=args.min_lateness_ms)
    except RankTraceError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        json.dump(analysis.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        write_text(format_ranks(analysis, limit=args.limit) + "\n")
    return 0
