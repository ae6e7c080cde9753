"""Find and read a saved trace file: the JSON document, or one clear error.

A trace is a Chrome trace JSON object with a ``traceEvents`` list, as
opscope and torch.profiler write it, plain or gzip-compressed (detected from
the content, not the name). A folder stands for the newest trace that
``tensorboard_trace_handler`` wrote in it. Every failure is a
:class:`TraceLoadError` whose one-line message names the file and the problem.

Reading is bounded, because a trace may come from anyone:

- only regular files are read (a FIFO, a device such as ``/dev/zero`` or a
  socket is refused before a byte is read, without blocking);
- the first bytes must look like a trace: optional blank space, then ``{`` or
  ``[``, or the gzip magic whose inflated text starts that way;
- the file's size, and for gzip its inflated size, must be at most the limit:
  ``max_bytes`` when given (the CLI's ``--max-trace-size``), else the
  environment variable ``OPSCOPE_MAX_TRACE_BYTES`` (``8G``, ``512M``, a
  number of bytes), else 4 GiB, which admits real multi-GB traces. Gzip is
  inflated in a streaming pass that keeps at most 256 MiB while it measures,
  so a gzip bomb is refused with flat memory. Under the default limit, a gzip
  that inflates past 256 MiB at more than 200 times its size (a bomb that
  opens like a trace) is refused too; an explicit limit admits it.
  ``read_trace`` streams a file (``trace_stream``, from :func:`iter_trace_chunks`):
  its memory is the events' columns, not the text; ``read_trace_document`` (the
  whole JSON document, for ``merge``) takes several times the text size.

Example::

    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.json")
    >>> _ = open(path, "w").write(json.dumps({"traceEvents": []}))
    >>> read_trace_document(path)["traceEvents"]
    []
    >>> read_trace_document(path + ".missing")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    opscope.load.trace_file.TraceLoadError: trace '...t.json.missing': no such file or folder
"""

from __future__ import annotations

import glob
import json
import os
import stat
import zlib
from typing import Any, Dict, Iterator

try:  # ISA-L's inflate (a dependency where it builds): twice zlib's speed, the same API
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - depends on the platform
    _inflate = zlib

try:  # parses JSON several times faster (orjson's when installed, else msgspec's, a
    from orjson import loads as fast_loads  # dependency); where it refuses, json decides
except ImportError:  # pragma: no cover - depends on the environment
    try:
        from msgspec.json import decode as fast_loads
    except ImportError:
        fast_loads = None

from opscope.load.trace_size import (DEFAULT_MAX_BYTES, MAX_BYTES_ENV,  # noqa: F401
                                     default_max_bytes, format_size, parse_size)

_INFLATE_ERRORS = tuple({zlib.error, _inflate.error})
TRACE_PATTERNS = ("*.pt.trace.json", "*.pt.trace.json.gz")
_GZIP_MAGIC = b"\x1f\x8b"
_JSON_SPACE = b" \t\r\n"
_SNIFF_SPACE = 2 ** 20      # blank bytes allowed before the JSON starts
_CHUNK = 2 ** 20            # bytes read, and at most inflated, per step
_KEEP_AT_ONCE = 256 * 2 ** 20  # inflated bytes kept by the first, measuring pass
# Real traces inflate 5-30x. Past _KEEP_AT_ONCE, a file that inflates more than this is
# refused under the default limit (an explicit limit admits it): it would be held whole.
_MAX_RATIO = 200
# A top-level JSON list is a trace (the array format) when it holds an event object.
LIST_WITHOUT_EVENTS = "not a trace: a JSON list without trace events (objects with a 'ph' phase)"


class TraceLoadError(ValueError):
    """A trace that cannot be loaded; the message is one line naming the file.

    ``path`` is the file, ``problem`` the rest of the message. Raised for: a
    missing file or a folder without a trace; a FIFO, device or socket; a
    size or inflated size over the limit (the message names the limit and
    ``--max-trace-size``/``OPSCOPE_MAX_TRACE_BYTES``); content that is not
    JSON, not an object with a ``traceEvents`` list, or nested too deeply; a
    truncated or corrupt gzip; and, from ``trace_events``, an event whose
    ``ts`` or ``dur`` (op and range events, ``[memory]`` and CPU instant
    events) is not a finite number within +-4e15 microseconds, named as
    ``traceEvents[12].dur (event 'aten::mm'): expected a number of
    microseconds, got string '5'``. Other fields of the wrong type or range
    (thread and flow ids, input shapes, sequence numbers, ``baseTimeNanoseconds``,
    the window event) are ignored as if absent. Anything else unforeseen is
    still a TraceLoadError ("malformed trace: ...", from ``load_session``).

    >>> str(TraceLoadError("x.json", "not valid JSON"))
    "trace 'x.json': not valid JSON"
    """

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = " ".join(str(problem).split())
        super().__init__(f"trace {path!r}: {self.problem}")

    def __reduce__(self):
        # crosses process boundaries whole (the parallel loader's workers raise it)
        return (type(self), (self.path, self.problem))


def resolve_trace_path(path: "str | os.PathLike[str]") -> str:
    """The file to read for ``path``: itself, or for a folder its newest trace.

    In a folder (as ``tensorboard_trace_handler`` writes), the newest file
    matching ``*.pt.trace.json`` or ``*.pt.trace.json.gz`` is chosen, by
    modification time, then by name (the handler puts a nanosecond clock in it).
    A merged job trace (``opscope.load.merged``) is skipped in a folder and
    refused when named.

    >>> import os, tempfile, time
    >>> folder = tempfile.mkdtemp()
    >>> for name in ("w.1.pt.trace.json", "w.2.pt.trace.json.gz"):
    ...     _ = open(os.path.join(folder, name), "w").write("{}")
    >>> os.path.basename(resolve_trace_path(folder))
    'w.2.pt.trace.json.gz'
    """
    from opscope.load.merged import merged_problem, merged_ranks

    text = os.fspath(path)
    if os.path.isdir(text):
        found = [f for pattern in TRACE_PATTERNS for f in glob.glob(os.path.join(text, pattern))]
        found = [f for f in found if os.path.isfile(f)]
        if not found:
            raise TraceLoadError(text, "folder has no *.pt.trace.json or *.pt.trace.json.gz "
                                       "file (expected a trace file, or a folder written by "
                                       "tensorboard_trace_handler)")
        for newest in sorted(found, key=lambda f: (os.path.getmtime(f), f), reverse=True):
            if merged_ranks(newest) is None:  # a merged job trace is skipped, as by every verb
                return newest
        raise TraceLoadError(text, "folder holds only merged traces (opscope merge), which "
                                   "are for trace viewers; give a rank's trace")
    if not os.path.exists(text):
        raise TraceLoadError(text, "no such file or folder")
    ranks = merged_ranks(text)
    if ranks is not None:
        raise TraceLoadError(text, merged_problem(ranks))
    return text


def _limit_is_explicit(max_bytes: "int | None") -> bool:
    return max_bytes is not None or bool(os.environ.get(MAX_BYTES_ENV, "").strip())


def _too_large(path: str, what: str, limit: int) -> TraceLoadError:
    return TraceLoadError(path, f"{what} is over the {format_size(limit)} limit (raise it "
                                f"with --max-trace-size SIZE or {MAX_BYTES_ENV}=SIZE)")


def _open_regular(path: str):
    """A binary file object for ``path``, refusing FIFOs, devices and sockets.

    The file is opened non-blocking and checked with ``fstat`` on the open
    descriptor, so a FIFO cannot hang the open and a swap after a check cannot
    slip a device in.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TraceLoadError(path, f"cannot read it ({exc.strerror or exc})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else
                "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else
                "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
        raise TraceLoadError(path, f"not a trace: it is {kind}, expected a regular "
                                   f".json or .json.gz file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), info.st_size


def _check_start(path: str, head: bytes) -> None:
    """Refuse content that cannot be a trace from its first bytes (once it shows)."""
    text = head.lstrip(_JSON_SPACE)
    if text[:3] == b"\xef\xbb\xbf":  # a UTF-8 byte order mark: json refuses it too
        text = text[3:].lstrip(_JSON_SPACE)
    if text and text[:1] not in (b"{", b"["):
        raise TraceLoadError(path, "not a trace: not valid JSON (it does not start with "
                                   "'{' or '['; expected Chrome trace JSON, plain or gzip)")
    if not text and len(head) >= _SNIFF_SPACE:
        raise TraceLoadError(path, f"not a trace: more than {format_size(_SNIFF_SPACE)} of "
                                   f"blank space before any JSON")


def _grew(path: str, limit: int) -> TraceLoadError:
    return _too_large(path, f"it grew while read to more than {format_size(limit)}, which", limit)


def _bomb(path: str, inflated: str, size: int, limit: int) -> TraceLoadError:
    return _too_large(path, f"inflated, it is {inflated} from {format_size(size)} (over "
                            f"{_MAX_RATIO}x, as only a decompression bomb is), and only a limit "
                            f"that is set explicitly admits more than "
                            f"{format_size(_KEEP_AT_ONCE)} of that; the default", limit)


def iter_trace_chunks(path: str, max_bytes: "int | None" = None,
                      chunk_bytes: "int | None" = None) -> Iterator[bytes]:
    """The file's content in chunks, decompressed when it is gzip, within ``max_bytes``.

    The file is opened and checked as the module docstring says; each failure is
    a :class:`TraceLoadError`, raised when the chunks reach it. With
    ``chunk_bytes``, no chunk is longer: the file is read and inflated a chunk
    at a time, and under the default limit a gzip is refused as a bomb as soon
    as it has inflated past 256 MiB at over 200 times its size. ``None`` is for
    a caller that keeps every chunk (:func:`read_trace_bytes`): a plain file
    comes as one chunk, one buffer of its size; a gzip is inflated by a first
    pass that keeps at most 256 MiB and past that only measures, and the bomb
    rule is applied to the whole inflated size before a second pass inflates
    it again to keep.

    >>> import gzip, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.json.gz")
    >>> _ = open(path, "wb").write(gzip.compress(b'{"traceEvents": []}'))
    >>> list(iter_trace_chunks(path, chunk_bytes=8))
    [b'{"traceE', b'vents": ', b'[]}']
    """
    limit = default_max_bytes() if max_bytes is None else max_bytes
    f, size = _open_regular(path)
    with f:
        if size > limit:
            raise _too_large(path, f"its size, {format_size(size)},", limit)
        try:
            head = f.read(_SNIFF_SPACE)
            if head[:2] != _GZIP_MAGIC:
                _check_start(path, head)
                yield from _plain_chunks(path, f, head, size, limit, chunk_bytes)
            elif chunk_bytes is None:
                yield from _kept_gzip(path, f, size, limit, _limit_is_explicit(max_bytes))
            else:
                explicit, total = _limit_is_explicit(max_bytes), 0
                for out in _inflated(path, f, limit, chunk_bytes):
                    total += len(out)
                    if total > _KEEP_AT_ONCE and total > _MAX_RATIO * size and not explicit:
                        raise _bomb(path, f"more than {format_size(total)}", size, limit)
                    yield out
        except _INFLATE_ERRORS as exc:
            raise TraceLoadError(path, f"corrupt gzip file ({exc})") from None
        except OSError as exc:
            raise TraceLoadError(path, f"cannot read it ({exc.strerror or exc})") from None


def _plain_chunks(path: str, f, head: bytes, size: int, limit: int,
                  chunk_bytes: "int | None") -> Iterator[bytes]:
    """A plain file whose first bytes ``head`` are read: with ``chunk_bytes``, ``head``
    cut to that size, then the rest a chunk at a time; with None, one chunk."""
    if chunk_bytes is None:
        f.seek(0)
        data = f.read(size + 1)  # one buffer of the file's size, not of the limit
        if len(data) > size:  # it grew after fstat
            data += f.read(limit + 1 - len(data))
        if len(data) > limit:
            raise _grew(path, limit)
        yield data
        return
    for start in range(0, len(head), chunk_bytes):
        yield head[start:start + chunk_bytes]
    total = len(head)
    while True:
        data = f.read(chunk_bytes)
        if not data:
            return
        total += len(data)
        if total > limit:
            raise _grew(path, limit)
        yield data


def _kept_gzip(path: str, f, size: int, limit: int, explicit: bool) -> Iterator[bytes]:
    """The gzip ``f`` for a caller that keeps it all: a first pass keeps at most 256 MiB,
    past that only measuring (a bomb costs no memory); within the limits, a second keeps it."""
    kept: "list | None" = []
    total = 0
    for out in _inflated(path, f, limit, _CHUNK):
        total += len(out)
        if total > _KEEP_AT_ONCE:
            kept = None  # from here on it only measures
        elif kept is not None:
            kept.append(out)
    if kept is not None:
        yield from kept
        return
    if total > _MAX_RATIO * size and not explicit:
        raise _bomb(path, format_size(total), size, limit)
    yield from _inflated(path, f, limit, _CHUNK)


def _inflated(path: str, f, limit: int, out_bytes: int) -> Iterator[bytes]:
    """Stream-inflate the (possibly multi-member) gzip ``f`` from its start.

    The chunks are at most ``out_bytes``; the first inflated bytes must look
    like a trace, and past ``limit`` it stops with a one-line error.
    """
    f.seek(0)
    total, head = 0, b""
    inflater, pending, started = _inflate.decompressobj(16 + zlib.MAX_WBITS), b"", False
    while True:
        if not pending:
            pending = f.read(_CHUNK)
            if not pending:
                break
        if not started:  # between members: zero padding is allowed (as gzip.decompress does)
            pending = pending.lstrip(b"\0")
            if not pending:
                continue
        started = True
        out = inflater.decompress(pending, out_bytes)
        pending = inflater.unconsumed_tail
        if inflater.eof:  # one member ended: what follows is another member, or padding
            pending = inflater.unused_data + pending
            inflater, started = _inflate.decompressobj(16 + zlib.MAX_WBITS), False
        total += len(out)
        if len(head) < _SNIFF_SPACE:
            head += out[:_SNIFF_SPACE]
            _check_start(path, head)
        if total > limit:
            raise _too_large(path, f"inflated, it is more than {format_size(limit)}, which",
                             limit)
        if out:
            yield out
    if started:  # a member was begun and not finished
        raise TraceLoadError(path, "truncated gzip file (it ends before the end of the "
                                   "compressed stream; was it still being written?)")


def read_trace_bytes(path: str, max_bytes: "int | None" = None) -> bytes:
    """The file's content, decompressed when it is gzip, within ``max_bytes``.

    ``max_bytes`` (default :func:`default_max_bytes`) bounds both the file's
    size and, for gzip, its inflated size. The inflated size is measured in a
    streaming pass that keeps nothing before anything is held, so a gzip bomb
    or ``/dev/zero`` is refused in seconds with flat memory.
    """
    return b"".join(iter_trace_chunks(path, max_bytes))


def json_loads(data: "bytes | str") -> Any:
    """``json.loads(data)``, by ``fast_loads`` where it accepts the text (the same
    objects, but integers past 64 bits, which orjson and msgspec make floats).

    >>> json_loads(b'{"a": [1, 2.5, NaN]}')  # both refuse NaN: json reads it
    {'a': [1, 2.5, nan]}
    """
    if fast_loads is not None:
        try:
            return fast_loads(data)
        except ValueError:  # NaN, integers past 64 bits, bad UTF-8: json's rules decide
            pass
    return json.loads(data)


def read_trace_document(path: "str | os.PathLike[str]",
                        max_bytes: "int | None" = None) -> Dict[str, Any]:
    """Parse the trace at ``path`` (a file or a folder) into its JSON object.

    The result always has a ``traceEvents`` list. A top-level JSON array (the
    Chrome trace "array format") is accepted as the event list itself.
    ``max_bytes`` bounds the (inflated) size, see the module docstring.
    """
    file = resolve_trace_path(path)
    data = read_trace_bytes(file, max_bytes)
    if not data.strip():
        raise TraceLoadError(file, "file is empty (expected Chrome trace JSON)")
    try:
        try:
            doc = json_loads(data)
        except UnicodeDecodeError:
            # torch 2.4 can write python_function names holding bytes that are not UTF-8;
            # the rest of such a trace is good, so those bytes become U+FFFD
            doc = json.loads(data.decode("utf-8", errors="replace"))
    except json.JSONDecodeError as exc:
        raise TraceLoadError(file, f"not a trace: not valid JSON ({exc.msg} at line "
                                   f"{exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise TraceLoadError(file, "not a trace: JSON nested too deeply") from None
    except MemoryError:
        raise TraceLoadError(file, f"not enough memory to parse its {format_size(len(data))} "
                                   f"of JSON") from None
    if isinstance(doc, list):
        if not any(type(e) is dict and "ph" in e for e in doc):
            raise TraceLoadError(file, LIST_WITHOUT_EVENTS)
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict):
        raise TraceLoadError(file, f"not a trace: the JSON is a {type(doc).__name__}, "
                                   f"expected an object with a 'traceEvents' list")
    if "traceEvents" not in doc:
        raise TraceLoadError(file, "not a trace: the JSON object has no 'traceEvents' list")
    if not isinstance(doc["traceEvents"], list):
        raise TraceLoadError(file, f"not a trace: 'traceEvents' is a "
                                   f"{type(doc['traceEvents']).__name__}, expected a list")
    return doc
