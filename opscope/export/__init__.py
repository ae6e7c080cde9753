"""Output formats: one module each, one entry each in ``EXPORTERS``.

An exporter is called as ``exporter(session, path)`` and writes the file
atomically. ``suffix`` is the file extension the format usually takes.

Example::

    >>> get_exporter("chrome_trace").suffix
    '.json'
    >>> sorted(EXPORTERS)
    ['chrome_trace', 'stacks']
    >>> get_exporter("svg")
    Traceback (most recent call last):
    ...
    ValueError: unknown export format 'svg'; expected one of: chrome_trace, stacks
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict

from opscope.export.chrome_trace import write_chrome_trace
from opscope.export.stacks import write_stacks


@dataclass(frozen=True)
class Exporter:
    """One output format: its name, writer and usual file extension."""

    name: str
    write: Callable[..., Any]
    suffix: str
    description: str

    def __call__(self, session, path, **options):
        return self.write(session, path, **options)


EXPORTERS: Dict[str, Exporter] = {
    e.name: e for e in (
        Exporter("chrome_trace", write_chrome_trace, ".json",
                 "Chrome trace (chrome://tracing, Perfetto, HTA); .gz to compress"),
        Exporter("stacks", write_stacks, ".stacks",
                 "collapsed stacks for flamegraph.pl and speedscope"),
    )
}


def get_exporter(name: str) -> Exporter:
    """The exporter registered as ``name``; ``ValueError`` listing the known ones."""
    try:
        return EXPORTERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown export format {name!r}; expected one of: "
                         f"{', '.join(sorted(EXPORTERS))}") from None


__all__ = ["EXPORTERS", "Exporter", "get_exporter", "write_chrome_trace", "write_stacks"]
