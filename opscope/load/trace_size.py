"""Trace sizes: the limit a loader applies, and sizes in words.

The limit is ``max_bytes`` when a caller gives one (the CLI's
``--max-trace-size``), else ``$OPSCOPE_MAX_TRACE_BYTES``, else 4 GiB.

Example::

    >>> parse_size("8G") == 8 * 2 ** 30, format_size(300)
    (True, '300 bytes')
"""

from __future__ import annotations

import os
import re

MAX_BYTES_ENV = "OPSCOPE_MAX_TRACE_BYTES"
DEFAULT_MAX_BYTES = 4 * 2 ** 30
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:i?B)?", re.IGNORECASE)


def default_max_bytes() -> int:
    """The size limit when none is given: ``OPSCOPE_MAX_TRACE_BYTES``, else 4 GiB.

    >>> default_max_bytes() == int(os.environ.get(MAX_BYTES_ENV, DEFAULT_MAX_BYTES))
    True
    """
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ValueError(f"environment variable {MAX_BYTES_ENV}: {exc}") from None


def parse_size(text: str) -> int:
    """A byte count such as ``4096``, ``512M``, ``8G`` or ``1.5GiB`` (binary units).

    >>> parse_size("512M"), parse_size("2GiB"), parse_size("100")
    (536870912, 2147483648, 100)
    >>> parse_size("lots")
    Traceback (most recent call last):
    ...
    ValueError: expected a size in bytes such as 4096, 512M or 8G; got 'lots'
    """
    match = _SIZE.fullmatch(str(text).strip())
    value = float(match.group(1)) if match else -1.0
    if not match or not value >= 1 or value == float("inf"):
        raise ValueError(f"expected a size in bytes such as 4096, 512M or 8G; got {text!r}")
    return int(value * 1024 ** "BKMGTP".index((match.group(2) or "B").upper()))


def format_size(n: int) -> str:
    """``n`` bytes in words: ``1.5 GiB``, ``300 bytes``.

    >>> format_size(3 * 2 ** 29), format_size(300)
    ('1.5 GiB', '300 bytes')
    """
    for unit, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"
