"""``opscope merge DIR -o merged.pt.trace.json``: a job's per-rank traces as one Chrome trace.

Every rank becomes one process ("rank R"), on clocks aligned by each trace's
``opscopeClockOffsetNs``; open the result in chrome://tracing or Perfetto.

Example::

    $ opscope merge out/ -o job.pt.trace.json
"""

from __future__ import annotations

import argparse
import sys

from opscope.cli.errors import UsageError
from opscope.cli.options import add_max_trace_size
from opscope.cli.progress import progress
from opscope.cli.terminal import terminal_safe, write_text

SUMMARY = "merge a distributed job's per-rank traces into one Chrome trace, a process per rank"
DESCRIPTION = """\
Read the per-rank traces in DIR (opscope's or torch.profiler's; a trace's rank
is distributedInfo.rank, else rank<R> in its file name) and write one Chrome
trace with one process per rank, on aligned clocks, for chrome://tracing and
Perfetto. Without -o it is DIR.merged.pt.trace.json, beside the folder. A
merged trace is for trace viewers: every verb skips it inside a folder
(it is marked opscopeMergedRanks) and refuses it when named."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``merge`` verb."""
    parser = subparsers.add_parser("merge", help=SUMMARY, description=DESCRIPTION,
                                   allow_abbrev=False)
    parser.add_argument("folder", metavar="DIR", help="folder of per-rank traces")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="the merged trace (.json or .json.gz; default: "
                             "DIR.merged.pt.trace.json, beside DIR)")
    add_max_trace_size(parser)
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    """Merge the traces; return 0."""
    from opscope.load.ranks import RankTraceError, trace_paths
    from opscope.export.merged_trace import default_output, write_merged_trace
    from opscope.load import TraceLoadError
    from opscope.load.parallel import WorkerDied

    output = args.output or default_output(args.folder)
    try:
        paths = trace_paths(args.folder)
        with progress(f"writing {terminal_safe(output)}"):
            ranks = write_merged_trace(paths, output, max_bytes=args.max_trace_size)
    except (RankTraceError, TraceLoadError, WorkerDied) as exc:
        raise UsageError(str(exc)) from None
    except (OSError, TypeError, ValueError) as exc:
        raise UsageError(f"argument -o/--output: {exc}") from None
    write_text(f"opscope: wrote {output} ({len(ranks)} ranks: "
               f"{', '.join(map(str, ranks))})\n", sys.stderr)
    return 0
