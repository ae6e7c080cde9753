"""Output formats: one module each, one entry each in ``FORMATS`` (``export/formats.py``).

A format is written as ``FORMATS[name](session, path, **options)``, atomically,
or picked by the path's extension with ``format_for_path``.

Example::

    >>> get_format("chrome_trace").extensions[0]
    '.json'
    >>> format_for_path("out.stacks").name
    'stacks'
"""

from __future__ import annotations

from opscope.export.chrome_trace import write_chrome_trace
from opscope.export.formats import FORMATS, OutputFormat, format_for_path, get_format
from opscope.export.stacks import write_stacks

__all__ = ["FORMATS", "OutputFormat", "format_for_path", "get_format", "write_chrome_trace",
           "write_stacks"]
