"""Read a trace file in bounded memory: its text in chunks, ``traceEvents`` in batches.

``stream_trace(path)`` gives the same ``RawSession`` as parsing the whole
document would, without ever holding the document: the file (plain or gzip,
under the limits of ``trace_file``) is decoded a chunk at a time; the
top-level keys other than ``traceEvents`` are small and parsed whole; the
event list is parsed a batch at a time and each batch goes into
``trace_columns.TraceColumns``, which keeps a hundred-odd bytes of columns
an op. So the peak is the columns plus one batch of JSON objects.

A batch is parsed by one ``loads`` of the events up to the last ``}`` that
closes an event in the text at hand (orjson's when installed, else msgspec's:
what they accept, json reads the same, but for integers past 64 bits, which they
make floats; what they refuse goes to json), the fast case; when that cut
proves wrong (a ``},`` inside a string, an odd layout) the events are parsed
one at a time with ``raw_decode``. Either way the result is exact: a cut is
used only when the text up to it parses as a list of whole events.

Example::

    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.json")
    >>> _ = open(path, "w").write(json.dumps({"traceEvents": [
    ...     {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2,
    ...      "ts": 1, "dur": 5}], "record_shapes": 1}))
    >>> raw = stream_trace(path)
    >>> raw.names, raw.options["record_shapes"]
    (['aten::mm'], True)
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from opscope.load.lean_events import lean_loads
from opscope.load.trace_fast import ScanFeed
from opscope.load.trace_columns import TraceColumns
from opscope.load.trace_events import columns_session
from opscope.load.trace_file import (LIST_WITHOUT_EVENTS, TraceLoadError, fast_loads,
                                     iter_trace_chunks)
from opscope.model.records import RawSession

CHUNK_BYTES = 4 * 2 ** 20  # bytes read (or inflated) per step: about a batch of events
_SPACE = re.compile(r"[ \t\n\r]*")
_EVENT_END = re.compile(r"[ \t\n\r]*,")  # what follows the last } of a batch's last event
_DECODER = json.JSONDecoder()

_fast_loads = fast_loads or json.loads  # a batch: orjson's or msgspec's where they take it
# scan(text, first) -> (events, some has a "ph") or None (trace_fast.ScanFeed.batch)
ScanBatch = Callable[[str, int], Optional[Tuple[int, bool]]]


def stream_trace(path: str, max_bytes: Optional[int] = None,
                 python_functions: Optional[str] = None, lean: bool = False,
                 scanner: Any = None) -> RawSession:
    """The RawSession of the trace file ``path``, read in bounded memory.

    ``max_bytes`` and the errors are those of ``trace_file``; the result is
    ``trace_events.trace_session`` of the parsed document. ``lean`` reads only
    the collectives' args (``trace_columns.TraceColumns``), about twice as fast.
    ``scanner``: the C trace scanner's module (``trace_fast``), which reads plain
    ops about ten times faster; None parses every event with json.
    """
    cols = TraceColumns(path, lean=lean)
    if scanner is None or lean:
        doc = parse_trace(path, cols.add, cols.reset, max_bytes, lean=lean)
        return columns_session(cols, doc, python_functions)
    feed = ScanFeed(scanner, cols, _fast_loads)
    try:
        doc = parse_trace(path, cols.add, feed.reset, max_bytes, scan=feed.batch)
    finally:
        feed.close()
    return columns_session(cols, doc, python_functions)


def parse_trace(path: str, events: Callable[[List[Any], int], None],
                restart: Callable[[], None], max_bytes: Optional[int] = None,
                keys: Optional[Dict[str, Any]] = None,
                chunk_bytes: Optional[int] = None, lean: bool = False,
                scan: Optional[ScanBatch] = None) -> Dict[str, Any]:
    """Parse the trace file ``path``: its top-level keys, without ``traceEvents``.

    ``events(batch, first)`` receives the event list in batches (``first``:
    the place of the batch's first event); ``restart()`` is called when a
    second ``traceEvents`` key starts (the last one counts, as in JSON).
    ``keys``, when given, is filled with each top-level key as it is parsed
    (and returned), so a caller that stops the parse from ``events`` still
    has the keys before the events. A batch is about ``chunk_bytes`` of text
    (default ``CHUNK_BYTES``; a caller that wants only the first events asks for
    a small one). ``lean``: the batches come from ``lean_events.lean_loads``, the
    ops' args unparsed, where it takes them. ``scan``: tried on each batch's text
    first (``trace_fast``); where it returns None the batch is parsed as usual.
    """
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    text = _TextReader(path, iter_trace_chunks(path, max_bytes, chunk_bytes), chunk_bytes)
    try:
        return _Document(text, events, restart, keys, lean, scan).parse()
    except RecursionError:
        raise TraceLoadError(path, "not a trace: JSON nested too deeply") from None
    except MemoryError:
        raise TraceLoadError(path, "not enough memory to parse it") from None


class _TextReader:
    """Decoded text of the byte chunks, kept from the parse position on.

    ``buf[pos:]`` is what is not parsed yet; ``more()`` appends the next
    chunk (False at the end). Lines and columns of errors count all text read.
    """

    def __init__(self, path: str, chunks: Iterator[bytes], chunk_bytes: int) -> None:
        self.path, self.chunks, self.chunk_bytes = path, chunks, chunk_bytes
        self.buf, self.pos, self.eof = "", 0, False
        self.lines, self.column_base = 0, 0  # of the text dropped before buf
        self.decoder: Any = None

    def more(self) -> bool:
        """Read the next chunk into the buffer; False when the file has ended."""
        if self.eof:
            return False
        data = next(self.chunks, None)
        if self.decoder is None:
            if data is None:
                data = b""
            encoding = json.detect_encoding(data[:4]) if data else "utf-8"
            # torch 2.4 can write names with bytes that are not UTF-8: they become U+FFFD
            errors = "replace" if encoding.startswith("utf-8") else "strict"
            self.decoder = codecs.getincrementaldecoder(encoding)(errors)
        try:
            text = self.decoder.decode(data or b"", final=data is None)
        except UnicodeDecodeError as exc:
            raise TraceLoadError(self.path, f"not a trace: not valid JSON ({exc})") from None
        self.eof = data is None
        self._drop()
        self.buf += text
        return bool(text) or not self.eof

    def _drop(self) -> None:
        done = self.buf[:self.pos]
        newlines = done.count("\n")
        if newlines:
            self.lines += newlines
            self.column_base = len(done) - done.rfind("\n") - 1
        else:
            self.column_base += len(done)
        self.buf, self.pos = self.buf[self.pos:], 0

    def error(self, message: str, pos: int) -> TraceLoadError:
        """The 'not valid JSON' error at ``pos`` of the buffer, with its line and column."""
        before = self.buf[:pos]
        newlines = before.count("\n")
        line = self.lines + newlines + 1
        column = (pos - before.rfind("\n") if newlines else self.column_base + pos + 1)
        return TraceLoadError(self.path, f"not a trace: not valid JSON ({message} at line "
                                         f"{line} column {column})")

    def skip_space(self) -> str:
        """Move past blank space; the next character ('' at the end)."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos:self.pos + 1]

    def value(self) -> Any:
        """Parse the JSON value at the position (reading more text while it is cut off)."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or not self.more():  # a number may go on
                    self.pos = end
                    return value
            except json.JSONDecodeError as exc:
                offset = exc.pos - self.pos  # reading more moves the buffer, not this
                if not self.more():
                    raise self.error(exc.msg, self.pos + offset) from None
                while len(self.buf) - self.pos < 2 * offset and self.more():
                    pass  # a long value: read well past it before parsing it again


class _Document:
    """The top-level parse: an object of keys, or the bare event list ("array format")."""

    def __init__(self, text: _TextReader, events: Callable[[List[Any], int], None],
                 restart: Callable[[], None], keys: Optional[Dict[str, Any]] = None,
                 lean: bool = False, scan: Optional[ScanBatch] = None) -> None:
        self.text, self.events, self.restart = text, events, restart
        self.scan = scan
        self.keys = {} if keys is None else keys
        self.seen_events = False
        self.loads = (lean_loads, _fast_loads) if lean else (_fast_loads,)

    def parse(self) -> Dict[str, Any]:
        text = self.text
        first = text.skip_space()
        if not first:
            raise TraceLoadError(text.path, "file is empty (expected Chrome trace JSON)")
        doc: Dict[str, Any] = {}
        if first == "[":  # the array format: a list of event objects, each with its "ph"
            if not self._event_list():
                raise TraceLoadError(text.path, LIST_WITHOUT_EVENTS)
            doc["traceEvents"] = []
        elif first == "{":
            doc = self._object()
        else:  # trace_file refuses this already; a chunk's start can be odd only in tests
            raise text.error("Expecting value", text.pos)
        if text.skip_space():
            raise text.error("Extra data", text.pos)
        if "traceEvents" not in doc:
            raise TraceLoadError(text.path, "not a trace: the JSON object has no "
                                            "'traceEvents' list")
        if not isinstance(doc["traceEvents"], list):
            raise TraceLoadError(text.path, f"not a trace: 'traceEvents' is a "
                                            f"{type(doc['traceEvents']).__name__}, "
                                            f"expected a list")
        return doc

    def _object(self) -> Dict[str, Any]:
        text, doc = self.text, self.keys
        text.pos += 1
        if text.skip_space() == "}":
            text.pos += 1
            return doc
        while True:
            if text.skip_space() != '"':
                raise text.error("Expecting property name enclosed in double quotes",
                                 text.pos)
            key = text.value()
            if text.skip_space() != ":":
                raise text.error("Expecting ':' delimiter", text.pos)
            text.pos += 1
            if key == "traceEvents" and text.skip_space() == "[":
                self._event_list()
                doc[key] = []  # the events went to the columns
            else:
                text.skip_space()
                doc[key] = text.value()
            after = text.skip_space()
            text.pos += 1
            if after == "}":
                return doc
            if after != ",":
                raise text.error("Expecting ',' delimiter", text.pos - 1)

    def _event_list(self) -> bool:
        """Parse the list at the position, handing its events over in batches.

        True when some item is an event (an object with a ``"ph"``).
        """
        text = self.text
        if self.seen_events:
            self.restart()
        self.seen_events = True
        text.pos += 1
        count, some_event = 0, False
        if text.skip_space() == "]":
            text.pos += 1
            return False
        while True:
            while len(text.buf) - text.pos < text.chunk_bytes and text.more():
                pass
            batch = self._fast_batch(count)
            if type(batch) is tuple:  # the scanner's (trace_fast): handed over already
                count += batch[0]
                some_event = some_event or batch[1]
                continue
            ended = False
            if batch is None:
                batch, ended = self._slow_batch()
            some_event = some_event or any(type(e) is dict and "ph" in e for e in batch)
            self.events(batch, count)
            count += len(batch)
            if ended:
                return some_event

    def _fast_batch(self, first: int) -> Union[None, List[Any], Tuple[int, bool]]:
        """The events up to the last one whole in the buffer, by one ``json.loads``;
        or what ``scan`` returned for them (``first``: the place of the first).

        None when no cut is found or the text up to it is not a list of events.
        """
        text = self.text
        buf, start = text.buf, text.pos
        end = len(buf)
        for _ in range(8):  # the last } followed by a comma closes an event, usually
            cut = buf.rfind("}", start, end)
            if cut < 0:
                return None
            after = _EVENT_END.match(buf, cut + 1)
            if after is not None:
                break
            end = cut
        else:
            return None
        if self.scan is not None:
            scanned = self.scan(buf[start:cut + 1], first)
            if scanned is not None:
                text.pos = after.end()
                return scanned
        text_batch = "[" + buf[start:cut + 1] + "]"
        batch = None
        for loads in self.loads:
            try:
                batch = loads(text_batch)
                break
            except (ValueError, RecursionError):  # json's errors, orjson's, or a bad cut
                pass
        if batch is None:
            try:  # json also takes NaN, integers past 64 bits and lone surrogates
                batch = json.loads(text_batch)
            except (json.JSONDecodeError, RecursionError):
                return None
        text.pos = after.end()
        return batch

    def _slow_batch(self, most: int = 1000) -> "tuple[List[Any], bool]":
        """Up to ``most`` events parsed one at a time: (events, whether the list ended)."""
        text, batch = self.text, []
        while len(batch) < most:
            text.skip_space()
            batch.append(text.value())
            after = text.skip_space()
            text.pos += 1
            if after == "]":
                return batch, True
            if after != ",":
                raise text.error("Expecting ',' delimiter", text.pos - 1)
        return batch, False
