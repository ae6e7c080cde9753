"""Options shared by the verbs, and the checks that turn bad values into usage errors.

Example::

    >>> parse_schedule("1,1,3")
    ScheduleSpec(wait=1, warmup=1, active=3, repeat=0)
    >>> parse_row_limit("-1")
    -1
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import NamedTuple

from opscope.cli.errors import UsageError

DEFAULT_OUTPUT_DIR = "opscope-out"
DEFAULT_SORT = "self_cpu_time_total"
DEFAULT_ROW_LIMIT = 20
SCHEDULE_FORM = "WAIT,WARMUP,ACTIVE[,REPEAT]"


class ScheduleSpec(NamedTuple):
    """The numbers of ``--schedule``, as ``opscope.schedule`` takes them."""

    wait: int
    warmup: int
    active: int
    repeat: int = 0


def parse_schedule(text: str) -> ScheduleSpec:
    """Parse ``WAIT,WARMUP,ACTIVE[,REPEAT]`` (integers >= 0, ACTIVE >= 1).

    >>> parse_schedule("0,1,2,4").repeat
    4
    >>> parse_schedule("1,1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected WAIT,WARMUP,ACTIVE[,REPEAT] (integers >= 0, ACTIVE >= 1), e.g. 1,1,3; got '1,1'
    """
    expected = f"expected {SCHEDULE_FORM} (integers >= 0, ACTIVE >= 1), e.g. 1,1,3; got {text!r}"
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(expected)
    spec = ScheduleSpec(*(int(p) for p in parts))
    if spec.active < 1:
        raise argparse.ArgumentTypeError(expected)
    return spec


def at_least_one(what: str):
    """An argparse ``type``: an integer >= 1, else a usage error naming ``what`` it is.

    >>> at_least_one("a number of processes")("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a number of processes >= 1, got '0'
    """
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected {what} >= 1, got {text!r}")
        return value
    return parse


def parse_row_limit(text: str) -> int:
    """A row count >= 1, or -1 for every row.

    >>> parse_row_limit("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected an integer >= 1, or -1 for all rows; got '0'
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 and value != -1:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 1, or -1 for all rows; got {text!r}")
    return value


def parse_sort_key(text: str) -> str:
    """A column ``key_averages().table(sort_by=...)`` accepts.

    >>> parse_sort_key("count")
    'count'
    """
    from opscope.export.table import valid_sort_keys

    if text not in valid_sort_keys():
        raise argparse.ArgumentTypeError(
            f"expected a table column such as self_cpu_time_total, cpu_time_total, count, "
            f"self_cpu_memory_usage or flops (see key_averages().table); got {text!r}")
    return text


def parse_max_trace_size(text: str) -> int:
    """``--max-trace-size``: bytes, or with a binary unit (``512M``, ``8G``).

    >>> parse_max_trace_size("8G")
    8589934592
    >>> parse_max_trace_size("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a size in bytes such as 4096, 512M or 8G; got '0'
    """
    from opscope.load.trace_file import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_max_trace_size(parser: argparse.ArgumentParser) -> None:
    """``--max-trace-size SIZE``: the largest trace (inflated, for gzip) a verb reads."""
    parser.add_argument(
        "--max-trace-size", metavar="SIZE", type=parse_max_trace_size, default=None,
        help="refuse a trace larger than this, inflated when gzip (e.g. 512M, 8G; default: "
             "$OPSCOPE_MAX_TRACE_BYTES, else 4G)")


def parse_memory_limit(text: str) -> int:
    """``--memory-limit``: bytes of a size as DuckDB spells it (``500MB``, ``2GB``, ``1.5GiB``).

    >>> parse_memory_limit("500MB")
    500000000
    >>> parse_memory_limit("lots")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: memory_limit 'lots' is not a size such as 500MB, 2GB or 1.5GiB
    """
    from opscope.store.budget import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


STORE_MEMORY_HELP = (
    "for a store: refuse, before reading it, a window whose rows need more memory than this, "
    "as estimated from its files' footers (e.g. 500MB, 2GB; default: 80%% of this machine's "
    "memory); when given, DuckDB's memory limit too")


def add_memory_limit(parser: argparse.ArgumentParser, help_text: str = STORE_MEMORY_HELP
                     ) -> None:
    """``--memory-limit SIZE`` (bytes: :func:`parse_memory_limit`; None when not given)."""
    parser.add_argument("--memory-limit", metavar="SIZE", type=parse_memory_limit,
                        default=None, help=help_text)


def add_output_dir(parser: argparse.ArgumentParser, what: str) -> None:
    """``-o/--output-dir DIR``."""
    parser.add_argument(
        "-o", "--output-dir", metavar="DIR", default=DEFAULT_OUTPUT_DIR,
        help=f"folder for {what}; created if missing (default: ./{DEFAULT_OUTPUT_DIR})")


def add_table_options(parser: argparse.ArgumentParser) -> None:
    """``--sort KEY`` and ``--row-limit N`` for the printed table."""
    parser.add_argument(
        "--sort", metavar="KEY", default=DEFAULT_SORT, type=parse_sort_key,
        help=f"sort the table by this column, as key_averages().table(sort_by=...) "
             f"(default: {DEFAULT_SORT}; others: cpu_time_total, count, "
             f"self_cpu_memory_usage, flops, ...)")
    parser.add_argument(
        "--row-limit", metavar="N", type=parse_row_limit, default=DEFAULT_ROW_LIMIT,
        help=f"rows in the table, -1 for all (default: {DEFAULT_ROW_LIMIT})")


def prepare_output_dir(path: str) -> str:
    """Create ``path`` if needed, check a file can be written there; return it absolute.

    Raises :class:`UsageError` naming ``-o/--output-dir`` when it cannot.

    >>> prepare_output_dir("/dev/null/x")
    Traceback (most recent call last):
    ...
    opscope.cli.errors.UsageError: argument -o/--output-dir: cannot create folder '/dev/null/x' (Not a directory)
    """
    folder = os.path.abspath(path)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"argument -o/--output-dir: {path!r} is a file; expected a folder")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"argument -o/--output-dir: cannot create folder {path!r} "
                         f"({exc.strerror or exc})") from None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UsageError(f"argument -o/--output-dir: cannot write files in {path!r} "
                         f"({exc.strerror or exc})") from None
    return folder
