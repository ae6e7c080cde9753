"""The ``opscope`` command: parser and dispatch to one module per verb.

Each verb module has ``add_parser(subparsers)``, which registers the verb and
sets ``handler``, a function from the parsed arguments to an exit status.
Adding a verb is one module and one entry in ``VERBS``.

Example::

    >>> main(["demo", "--steps", "1"])
    Traceback (most recent call last):
    ...
    SystemExit: 2
"""

from __future__ import annotations

import sys
from typing import List, Optional

from opscope.cli import convert, demo, diff, merge, query, ranks, report, run, table, trigger
from opscope.cli.errors import USAGE_EXIT, OneLineParser, UsageError, print_error
from opscope.cli.terminal import CLOSED_PIPE_EXIT, silence_closed_streams

VERBS = (run, demo, report, table, diff, trigger, ranks, merge, convert, query)


def build_parser() -> OneLineParser:
    """The argument parser of ``opscope`` with every verb registered."""
    from opscope.version import __version__

    parser = OneLineParser(
        prog="opscope", allow_abbrev=False,
        description="Profile PyTorch programs: the torch.profiler API on opscope's own "
                    "collector. Run 'opscope COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"opscope {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command",
                                       required=True)
    for verb in VERBS:
        verb.add_parser(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the verb, exit with its status.

    A reader that closes the pipe early (``opscope query ... | head``) ends
    any verb quietly, with status 141 as a process stopped by SIGPIPE.
    """
    try:
        try:
            status = _parse_and_run(argv)
        except SystemExit as exc:  # --help, --version, a bad option: flushed here too
            status = exc.code
        sys.stdout.flush()
    except BrokenPipeError:
        silence_closed_streams()
        status = CLOSED_PIPE_EXIT
    sys.exit(status)


def _parse_and_run(argv: Optional[List[str]]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as exc:
        print_error(str(exc))
        return USAGE_EXIT
