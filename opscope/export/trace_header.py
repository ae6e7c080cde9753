"""The Chrome trace's top-level keys: the recorded window, option flags and user metadata.

``opscope.export.chrome_trace`` writes these before ``traceEvents``; the API
layer validates metadata with :func:`validate_metadata_json` when it is added.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> trace_window(build_session(RawSession.empty()))
    (0, 0)
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, Tuple

from opscope.model.session import OPTION_NAMES, ProfileSession

# Top-level keys the trace writer sets itself; user metadata may not reuse them.
RESERVED_KEYS = frozenset({
    "schemaVersion", "deviceProperties", "trace_id", "displayTimeUnit",
    "baseTimeNanoseconds", "traceEvents", "traceName",
})
# torch writes these flags in this order, each only when the option is on
_FLAG_ORDER = ("with_stack", "profile_memory", "record_shapes", "with_modules", "with_flops")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def validate_metadata_json(key: str, text: str) -> Any:
    """Check one metadata entry and return its parsed JSON value.

    ``text`` must be strict JSON (no NaN/Infinity); ``key`` must be a string
    that is not one of the trace's own top-level keys. The API layer calls
    this when metadata is added, so a bad value fails where it was given.

    >>> validate_metadata_json("distributedInfo", '{"rank": 0}')
    {'rank': 0}
    >>> validate_metadata_json("note", "not json")
    Traceback (most recent call last):
    ...
    ValueError: metadata 'note': value is not valid JSON (Expecting value at position 0): 'not json'
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"metadata key must be a non-empty string, got {key!r}")
    if key in RESERVED_KEYS:
        raise ValueError(f"metadata key {key!r} is reserved by the Chrome trace format; "
                         f"reserved keys: {', '.join(sorted(RESERVED_KEYS))}")
    if not isinstance(text, str):
        raise ValueError(f"metadata {key!r}: value must be JSON text (str), "
                         f"got {type(text).__name__}")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        raise ValueError(f"metadata {key!r}: value is not valid JSON "
                         f"({err.msg} at position {err.pos}): {text[:80]!r}") from None
    except ValueError as err:
        raise ValueError(f"metadata {key!r}: value is not valid JSON ({err}): "
                         f"{text[:80]!r}") from None


def trace_window(session: ProfileSession) -> Tuple[int, int]:
    """(start, stop) of the recorded window in collector ns.

    The session's own start/stop when set, widened to cover every event;
    the events' extent when the session has none.
    """
    table = session.table
    start, stop = session.start_ns, session.stop_ns
    if len(table):
        first, last = int(table.start_ns.min()), int(table.end_ns.max())
        if stop > start:
            return min(start, first), max(stop, last)
        return first, last
    return (start, stop) if stop > start else (start, start)


def trace_header(session: ProfileSession) -> Dict[str, Any]:
    """Top-level keys before ``traceEvents``, in the order they are written.

    Option flags appear (as ``1``) only when on, like torch; then each user
    metadata entry as a parsed JSON value, which may override a flag.

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> s = ProfileSession(EventTable.from_raw(RawSession.empty()))
    >>> s.options["record_shapes"] = True
    >>> s.metadata["distributedInfo"] = '{"rank": 0}'
    >>> list(trace_header(s))  # doctest: +NORMALIZE_WHITESPACE
    ['schemaVersion', 'deviceProperties', 'record_shapes', 'distributedInfo',
     'trace_id', 'displayTimeUnit', 'baseTimeNanoseconds']
    """
    header: Dict[str, Any] = {"schemaVersion": 1, "deviceProperties": []}
    for flag in _FLAG_ORDER + tuple(n for n in OPTION_NAMES if n not in _FLAG_ORDER):
        if session.options.get(flag):
            header[flag] = 1
    for key, text in session.metadata.items():
        header[key] = validate_metadata_json(key, text)
    header["trace_id"] = uuid.uuid4().hex.upper()
    header["displayTimeUnit"] = "ms"
    header["baseTimeNanoseconds"] = _base_time_ns(session)
    return header


def _base_time_ns(session: ProfileSession) -> int:
    # Unix time of the window start, rounded down to a whole second: ts stay
    # small (a double holds them to the ns) and never negative.
    start, _ = trace_window(session)
    return (start + session.epoch_offset_ns) // 1_000_000_000 * 1_000_000_000
