"""Every output format, one entry each: ``FORMATS``.

An entry has the format's name, its file extensions (the first one is the
usual one), its writer (``write(session, path, **options)``, atomic), the
profiler options it needs (``needs``: the writer refuses a session without
them) and those it shows when present (``uses``). The format follows from a
path's extension (``format_for_path``), as py-spy's format enum picks the
extension; where two formats share one (``.json``, ``.html``), the longest
extension and then the first entry win, so name the format to get the other.

``profile.export_*``, the ``on_trace_ready`` handlers (``opscope.handlers``)
and the CLI (``opscope.cli.results``) all write through this table. Adding a
format is one module with its writer plus one entry here.

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

from opscope.export.chrome_trace import write_chrome_trace
from opscope.export.stacks import write_stacks


def _no_check(**_options: Any) -> None:
    """Options need no check before the session is read."""


@dataclass(frozen=True)
class OutputFormat:
    """One output format: its name, extensions, writer and the options it needs.

    ``check(**options)`` validates the writer's own options (a device, a
    metric) before anything is read or written. Calling the entry writes.
    """

    name: str
    extensions: Tuple[str, ...]
    write: Callable[..., Any]
    description: str
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
        return self.write(session, path, **options)


def _check_device(device: Optional[str] = None) -> None:
    """A bad device fails before any file is touched."""
    if device is not None:
        from opscope.analysis.memory_timeline import parse_device

        parse_device(device)


def _write_memory_timeline(session, path, device: Optional[str] = None) -> None:
    """The memory timeline of ``device`` (default: the first GPU if any, else the CPU)."""
    from opscope.export.memory_timeline import write_memory_timeline

    if device is None:
        import torch

        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    write_memory_timeline(session, os.fspath(path), device)


def _write_report(session, path) -> None:
    """The HTML report (``opscope.report``, imported when first written)."""
    from opscope.report import write_report

    write_report(session, path)


FORMATS: Dict[str, OutputFormat] = {f.name: f for f in (
    OutputFormat("chrome_trace", (".json", ".json.gz"), write_chrome_trace,
                 "Chrome trace (chrome://tracing, Perfetto, HTA); .gz to compress",
                 uses=("record_shapes", "with_stack", "with_modules", "profile_memory")),
    OutputFormat("stacks", (".stacks", ".stacks.gz"), write_stacks,
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
