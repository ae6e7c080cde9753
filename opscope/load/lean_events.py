"""Trace events whose ``args`` stay unparsed: the front end of a lean load.

A rank's facts (``opscope ranks``) need every op's name, thread and times, but
the ``args`` of the collectives only; yet the args (input shapes, types, stacks)
are most of a trace's bytes and of its parsed objects. ``lean_loads(text)``
parses a JSON list of events with msgspec into dicts of the fields the loader
reads (``ph``, ``cat``, ``name``, ``pid``, ``tid``, ``ts``, ``dur``, ``id``,
``args``), where ``args`` stays a ``msgspec.Raw``: its text, checked as JSON but
not turned into objects. ``op_args(raw)`` parses one event's args where the
loader reads them: the collectives' and the first ``python_function`` events'
(``trace_columns``, lean mode), and those of the few events that are not ops
(``trace_scan``: memory, instants, thread names, device events).

About five times faster than parsing every object (10,000 events of a torch
trace: 12 ms against 68 ms with orjson, freeing included). Without msgspec, or
for text msgspec refuses (NaN, a bad surrogate, an item that is not an object),
``lean_loads`` raises ValueError and the loader parses the batch as usual.

Example::

    >>> events = lean_loads('[{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, '
    ...                     '"args": {"Input Dims": [[2, 2]]}, "bp": "e"}]')
    >>> sorted(events[0]), op_args(events[0]["args"])
    (['args', 'cat', 'name', 'ph', 'ts'], {'Input Dims': [[2, 2]]})
    >>> op_args({"a": 1}), op_args(None), lean_loads('[{"tid": 18446744073709551616}]')
    ({'a': 1}, None, [{'tid': 18446744073709551616}])
"""

from __future__ import annotations

from typing import Any, List, TypedDict, Union

from opscope.load.trace_file import json_loads

try:  # declared by the package; a load without it parses every object
    import msgspec
except ImportError:  # pragma: no cover - depends on the environment
    msgspec = None

# What a field may hold for msgspec to read it as json would: an integer field keeps
# integers past 64 bits exact, where ``Any`` would make them floats; anything else
# (a float name, a list where a thread id goes) is refused, and json reads the batch.
_KEY = Union[str, int, bool, None]
_TIME = Union[int, float, str, bool, None]

if msgspec is not None:
    class _LeanEvent(TypedDict, total=False):
        ph: _KEY
        cat: _KEY
        name: _KEY
        pid: _KEY
        tid: _KEY
        ts: _TIME
        dur: _TIME
        id: _KEY
        args: msgspec.Raw

    _DECODER = msgspec.json.Decoder(List[_LeanEvent])
    _RAW = msgspec.Raw
else:  # pragma: no cover - depends on the environment
    _DECODER = None
    _RAW = ()


def lean_loads(text: "str | bytes") -> List[Any]:
    """The events of the JSON list ``text``, ops' args unparsed (see the module doc).

    Raises ValueError where msgspec is missing or refuses the text.

    >>> try:
    ...     lean_loads('[1]')
    ... except ValueError:
    ...     print("refused: the loader parses it as usual")
    refused: the loader parses it as usual
    """
    if _DECODER is None:  # pragma: no cover - depends on the environment
        raise ValueError("msgspec is not installed")
    return _DECODER.decode(text)


def op_args(args: Any) -> Any:
    """``args`` parsed as a full load parses them (``trace_file.json_loads``), where it
    is still raw text; anything else as it is."""
    return json_loads(bytes(args)) if type(args) is _RAW else args


# Every field of a Chrome trace event (Trace Event Format, and Kineto's), for
# ``read_raw_args_trace``: an event with any other field is refused, so that a
# rewritten event never loses one.
_EVENT_FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "id2", "bp", "s",
                 "tts", "tdur", "cname", "sf", "esf", "bind_id", "flow_in", "flow_out",
                 "scope", "use_async_tts")

if msgspec is not None:
    _FIELD = Union[int, float, str, bool, None, msgspec.UnsetType]
    RawArgsEvent = msgspec.defstruct(
        "RawArgsEvent", [(name, _FIELD, msgspec.UNSET) for name in _EVENT_FIELDS]
        + [("args", Union[msgspec.Raw, msgspec.UnsetType], msgspec.UNSET)],
        forbid_unknown_fields=True, omit_defaults=True)

    class RawArgsTrace(msgspec.Struct):
        """A trace's events (args raw) and the top-level keys a job's merge reads."""

        traceEvents: List[RawArgsEvent]  # type: ignore[valid-type]
        distributedInfo: Any = None
        baseTimeNanoseconds: _FIELD = None
        opscopeClockOffsetNs: _FIELD = None

    _TRACE_DECODER = msgspec.json.Decoder(RawArgsTrace)
    _EVENT_ENCODER = msgspec.json.Encoder()
    UNSET = msgspec.UNSET
else:  # pragma: no cover - depends on the environment
    _TRACE_DECODER = _EVENT_ENCODER = UNSET = None


def read_raw_args_trace(data: bytes):
    """The :class:`RawArgsTrace` of a trace file's bytes: each event a struct of its
    fields (absent ones ``UNSET``), its ``args`` raw, to be rewritten and encoded again
    (``encode_event``) without parsing them.

    Raises ValueError where msgspec is missing or refuses the text: not a JSON object
    with a ``traceEvents`` list of events, an event field other than the known ones
    (``_EVENT_FIELDS``) or a field that is a list or an object (but ``args``), NaN, bad
    UTF-8. The caller then reads the trace as usual.

    >>> doc = read_raw_args_trace(b'{"traceEvents": [{"ph": "X", "ts": 1, "pid": 3, '
    ...                           b'"args": {"a": [1, 2]}}], "baseTimeNanoseconds": 5}')
    >>> e = doc.traceEvents[0]
    >>> e.pid, e.dur is UNSET, doc.baseTimeNanoseconds
    (3, True, 5)
    >>> e.pid = 0
    >>> encode_event(e)
    b'{"ph":"X","pid":0,"ts":1,"args":{"a": [1, 2]}}'
    >>> try:
    ...     read_raw_args_trace(b'{"traceEvents": [{"ph": "X", "other": 1}]}')
    ... except ValueError:
    ...     print("refused")
    refused
    """
    if _TRACE_DECODER is None:  # pragma: no cover - depends on the environment
        raise ValueError("msgspec is not installed")
    return _TRACE_DECODER.decode(data)


def encode_event(event) -> bytes:
    """One :func:`read_raw_args_trace` event as compact JSON, its args as they were read."""
    return _EVENT_ENCODER.encode(event)
