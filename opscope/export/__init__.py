"""Output formats: one module each, one entry each in ``FORMATS`` (``export/formats.py``).

A format is written as ``FORMATS[name](session, path, **options)``, atomically.
``EXPORTERS`` and ``get_exporter`` are the registry's older names.

Example::

    >>> get_exporter("chrome_trace").suffix
    '.json'
    >>> sorted(EXPORTERS)
    ['chrome_trace', 'memory_timeline', 'report', 'stacks']
    >>> get_exporter("svg")
    Traceback (most recent call last):
    ...
    ValueError: unknown export format 'svg'; expected one of: chrome_trace, memory_timeline, report, stacks
"""

from __future__ import annotations

from opscope.export.chrome_trace import write_chrome_trace
from opscope.export.formats import FORMATS, OutputFormat, format_for_path, get_format
from opscope.export.stacks import write_stacks

EXPORTERS = FORMATS
Exporter = OutputFormat
get_exporter = get_format

__all__ = ["EXPORTERS", "Exporter", "FORMATS", "OutputFormat", "format_for_path",
           "get_exporter", "get_format", "write_chrome_trace", "write_stacks"]
