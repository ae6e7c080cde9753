"""Every output format, one entry each: ``FORMATS``, the layer above every writer.

An entry has the format's name, its file extensions (the first one is the
usual one), its writer, whether it writes bytes (``binary``), the profiler
options it needs (``needs``: the writer refuses a session without them) and
those it shows when present (``uses``). Calling an entry,
``FORMATS[name](session, path, **options)``, checks and opens the destination
once (``opscope.files.output_file``: atomic, gzip for .gz) and hands the
writer the open stream: ``write(session, out, path, **options)``, py-spy's
way; no writer checks or opens a path. The format follows from a
path's extension (``format_for_path``), as py-spy's format enum picks the
extension; where two formats share one (``.json``, ``.html``), the longest
extension and then the first entry win, so name the format to get the other.

``profile.export_*``, the ``on_trace_ready`` handlers (``opscope.handlers``)
and the CLI (``opscope.cli.results``) all write through this table. Adding a
format is one module with its stream writer (in ``opscope/export/`` or
``opscope/report/``) plus one entry here.

Example::

    >>> list(FORMATS)
    ['chrome_trace', 'stacks', 'report', 'memory_timeline']
    >>> format_for_path("run/trace.json.gz").name, format_for_path("m.raw.json.gz").name
    ('chrome_trace', 'memory_timeline')
    >>> FORMATS["memory_timeline"].needs, FORMATS["report"].method
    (('profile_memory',), 'export_report')
    >>> get_format("svg")
    Traceback (most recent call last):
    ...
    ValueError: unknown export format 'svg'; expected one of: chrome_trace, memory_timeline, report, stacks
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from opscope.export.chrome_trace import chrome_trace_to
from opscope.export.stacks import stacks_to
from opscope.files import output_file


def _no_check(**_options: Any) -> None:
    """Options need no check before the session is read."""


@dataclass(frozen=True)
class OutputFormat:
    """One output format: its name, extensions, writer and the options it needs.

    ``check(**options)`` validates the writer's own options (a device, a
    metric) before anything is read or written. Calling the entry writes:
    ``write(session, out, path, **options)`` gets the open stream ``out``
    (bytes when ``binary``, else text) and the checked ``path`` as a str.
    """

    name: str
    extensions: Tuple[str, ...]
    write: Callable[..., Any]
    description: str
    binary: bool = False
    needs: Tuple[str, ...] = ()
    uses: Tuple[str, ...] = ()
    check: Callable[..., None] = _no_check

    @property
    def method(self) -> str:
        """The ``opscope.profile`` method that writes this format (``export_<name>``)."""
        return f"export_{self.name}"

    @property
    def suffix(self) -> str:
        """The usual file extension (the first one)."""
        return self.extensions[0]

    def matches(self, path: Any) -> str:
        """The longest of this format's extensions ``path`` ends with ('' if none)."""
        name = os.fspath(path)
        return max((e for e in self.extensions if name.endswith(e)), key=len, default="")

    def __call__(self, session, path, **options):
        """Check and open ``path`` once, then write ``session`` to it; the writer's result.

        >>> import os, tempfile
        >>> from opscope.analysis.build import build_session
        >>> from opscope.model.records import RawSession
        >>> path = os.path.join(tempfile.mkdtemp(), "empty.stacks")
        >>> FORMATS["stacks"](build_session(RawSession.empty()), path)
        >>> open(path).read()
        ''
        """
        destination = output_file(path, self.method)
        with destination.open(binary=self.binary) as out:
            return self.write(session, out, destination.path, **options)


def _check_device(device: Optional[str] = None) -> None:
    """A bad device fails before any file is touched."""
    if device is not None:
        from opscope.analysis.memory_timeline import parse_device

        parse_device(device)


def _write_memory_timeline(session, out, path: str, device: Optional[str] = None) -> None:
    """The memory timeline of ``device`` (default: the first GPU if any, else the CPU)."""
    from opscope.export.memory_timeline import memory_timeline_to

    if device is None:
        import torch

        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    memory_timeline_to(session, out, path, device)


def _write_report(session, out, path: str) -> None:
    """The HTML report (``opscope.report``, imported when first written)."""
    from opscope.report import report_to

    report_to(session, out, path)


FORMATS: Dict[str, OutputFormat] = {f.name: f for f in (
    OutputFormat("chrome_trace", (".json", ".json.gz"), chrome_trace_to,
                 "Chrome trace (chrome://tracing, Perfetto, HTA); .gz to compress", binary=True,
                 uses=("record_shapes", "with_stack", "with_modules", "profile_memory")),
    OutputFormat("stacks", (".stacks", ".stacks.gz"), stacks_to,
                 "collapsed stacks for flamegraph.pl and speedscope",
                 uses=("with_stack",)),
    OutputFormat("report", (".html",), _write_report,
                 "the self-contained HTML report",
                 uses=("record_shapes", "with_stack", "with_modules", "profile_memory")),
    OutputFormat("memory_timeline", (".json", ".json.gz", ".raw.json.gz", ".html"),
                 _write_memory_timeline, "memory by category over time (JSON or an HTML plot)",
                 needs=("profile_memory",), check=_check_device),
)}


def get_format(name: str) -> OutputFormat:
    """The format registered as ``name``; ``ValueError`` listing the known ones."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown export format {name!r}; expected one of: "
                         f"{', '.join(sorted(FORMATS))}") from None


def format_for_path(path: Any) -> OutputFormat:
    """The format ``path``'s extension names: the longest match, then the first entry.

    >>> format_for_path("flame.stacks").name, format_for_path("r.html").name
    ('stacks', 'report')
    >>> format_for_path("out.csv")
    Traceback (most recent call last):
    ...
    ValueError: no export format writes 'out.csv': expected a file name ending in .html, .json, .json.gz, .raw.json.gz, .stacks, .stacks.gz
    """
    best = max(FORMATS.values(), key=lambda f: len(f.matches(path)))
    if not best.matches(path):
        known = sorted({e for f in FORMATS.values() for e in f.extensions})
        raise ValueError(f"no export format writes {os.fspath(path)!r}: expected a file "
                         f"name ending in {', '.join(known)}")
    return best


def missing_option(fmt: OutputFormat, options: Dict[str, Any]) -> Optional[str]:
    """The first option ``fmt`` needs that ``options`` (name -> bool) lacks, or None.

    >>> missing_option(FORMATS["memory_timeline"], {"profile_memory": False})
    'profile_memory'
    """
    return next((need for need in fmt.needs if not options.get(need)), None)
