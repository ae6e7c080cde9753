"""The writing half of the execution trace: torch's ET JSON, in the installed torch's format.

The layout follows what the installed torch writes, byte for byte apart from
the timestamps: a header (``schema``, ``pid``, ``time``, ``start_ts``),
``nodes`` in the order they finished, the process root node last, then
``finish_ts``. What changed between torch versions is one ``EtFormat`` entry
in ``FORMATS`` (the id numbering, which also changed, is chosen at build time
in ``collect/native/et_observer.cpp``). The file is written atomically
(``opscope.files``): it appears whole when the writer finishes, never
half-written.

Example::

    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "et.json")
    >>> writer = ExecutionTraceWriter(path)
    >>> writer.write_nodes([])
    >>> writer.finish()
    >>> [n["name"] for n in json.load(open(path))["nodes"]]
    ['[pytorch|profiler|execution_trace|process]']
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Iterable, NamedTuple, Optional, Tuple, Union

from opscope.files import OutputFile, PathLike, output_file


class EtFormat(NamedTuple):
    """What one range of torch versions writes.

    ``since`` is the first (major, minor) with this format. ``indent`` is the
    indentation of a node's braces (its fields get two more spaces).
    """

    since: Tuple[int, int]
    schema: str
    strides: bool  # the ports have a "strides" array
    tensor_range: bool  # the attrs end with a "tensor_range" string
    indent: int


# Compared with torch's own observer on 2.4.1, 2.8.0, 2.13.0 and 2.15.0; the
# versions in between are assumed to write what the nearest checked one below does.
FORMATS = (
    EtFormat((2, 4), "1.1.0-chakra.0.0.4", strides=False, tensor_range=False, indent=4),
    EtFormat((2, 5), "1.1.1-chakra.0.0.4", strides=True, tensor_range=True, indent=6),
)


def torch_version() -> Tuple[int, int]:
    """(major, minor) of the installed torch."""
    import torch

    found = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def format_for(version: Tuple[int, int]) -> EtFormat:
    """The format torch ``version`` writes (the oldest known one before 2.4).

    >>> format_for((2, 4)).schema, format_for((2, 13)).schema
    ('1.1.0-chakra.0.0.4', '1.1.1-chakra.0.0.4')
    """
    chosen = FORMATS[0]
    for fmt in FORMATS:
        if version >= fmt.since:
            chosen = fmt
    return chosen


SCHEMA_VERSION = FORMATS[-1].schema
ROOT_ID = 1
PROCESS_NODE_NAME = "[pytorch|profiler|execution_trace|process]"
USER_SCOPE = 7  # at::RecordScope::USER_SCOPE

_EMPTY_PORT = ("[]", "[]", "[]", "[]")


def steady_ms() -> int:
    """torch's ``start_ts``/``finish_ts`` clock: steady (monotonic) time in ms."""
    return time.monotonic_ns() // 1_000_000


def format_node(node: tuple, fmt: EtFormat = FORMATS[-1]) -> str:
    """One node, as the torch that writes ``fmt`` lays it out.

    ``node`` is a tuple from ``NodeCollector.take_nodes()``; its inputs and
    outputs are (values, shapes, types, strides), each a JSON array as text.

    >>> print(format_node(process_node()).splitlines()[2])
            "id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1,
    >>> print(format_node(process_node(), FORMATS[0]).splitlines()[3])
          "inputs": {"values": [], "shapes": [], "types": []},
    """
    (node_id, name, parent, rf_id, fw_parent, seq_id, scope, tid, fw_tid, schema,
     inputs, outputs) = node
    brace = " " * fmt.indent
    field = brace + "  "
    tensor_range = (',{"name": "tensor_range", "type": "string", "value": ""}'
                    if fmt.tensor_range else "")
    return (
        f"\n{brace}{{\n"
        f'{field}"id": {node_id}, "name": {_json_text(name)}, "ctrl_deps": {parent},\n'
        f'{field}"inputs": {_port(inputs, fmt)},\n'
        f'{field}"outputs": {_port(outputs, fmt)},\n'
        f'{field}"attrs": [{{"name": "rf_id", "type": "uint64", "value": {rf_id}}},'
        f'{{"name": "fw_parent", "type": "uint64", "value": {fw_parent}}},'
        f'{{"name": "seq_id", "type": "int64", "value": {seq_id}}},'
        f'{{"name": "scope", "type": "uint64", "value": {scope}}},'
        f'{{"name": "tid", "type": "uint64", "value": {tid}}},'
        f'{{"name": "fw_tid", "type": "uint64", "value": {fw_tid}}},'
        f'{{"name": "op_schema", "type": "string", "value": {_json_text(schema)}}},'
        '{"name": "kernel_backend", "type": "string", "value": ""},'
        f'{{"name": "kernel_file", "type": "string", "value": ""}}{tensor_range}]\n'
        f"{brace}}}"
    )


def _port(port: tuple, fmt: EtFormat) -> str:
    values, shapes, types, strides = port
    text = f'{{"values": {values}, "shapes": {shapes}, "types": {types}'
    return text + (f', "strides": {strides}}}' if fmt.strides else "}")


def _json_text(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def process_node() -> tuple:
    """The root node torch adds last: id 1, its own parent."""
    return (ROOT_ID, PROCESS_NODE_NAME, ROOT_ID, 0, 0, -1, USER_SCOPE, 0, 0, "",
            _EMPTY_PORT, _EMPTY_PORT)


class ExecutionTraceWriter:
    """Streams one execution trace into a temp file; ``finish()`` puts it in place.

    The header is written when the writer is made (torch stamps ``time`` and
    ``start_ts`` at registration). ``abandon()`` removes the temp file and
    leaves ``path`` as it was. A ``path`` ending in ``.gz`` is gzip-compressed.

    A write error (a full disk) is raised once, as an ``OSError`` naming
    ``path``; the temp file is removed at once and ``failed`` holds the error,
    so the later ``write_nodes``/``finish`` calls of a cleanup do nothing
    instead of raising again.
    """

    def __init__(self, path: Union[PathLike, OutputFile], fmt: Optional[EtFormat] = None):
        destination = path if isinstance(path, OutputFile) else output_file(
            path, "ExecutionTraceWriter")
        self.path = destination.path
        self.format = fmt if fmt is not None else format_for(torch_version())
        self.failed: Optional[BaseException] = None
        self._context = destination.open()
        self._out: Optional[Any] = self._context.__enter__()
        self._out.write(
            "{\n"
            f'  "schema": "{self.format.schema}", "pid": {os.getpid()}, '
            f'"time": "{time.strftime("%Y-%m-%d %X")}", "start_ts": {steady_ms()},\n'
            '  "nodes": [')

    def write_nodes(self, nodes: Iterable[tuple]) -> None:
        """Append nodes (each followed by a comma: the process node comes last)."""
        if self.failed is not None:
            return  # the error was raised already; the file will not be written
        out = self._require_open()
        try:
            for node in nodes:
                out.write(format_node(node, self.format))
                out.write(",")
        except BaseException as exc:
            self.failed = exc
            self._close(exc)
            raise

    def finish(self) -> None:
        """Write the process node and ``finish_ts``, then move the file into place."""
        if self.failed is not None:
            return
        out = self._require_open()
        try:
            out.write(format_node(process_node(), self.format))
            out.write(f'\n  ],\n  "finish_ts": {steady_ms()}\n}}')
        except BaseException as exc:
            self.failed = exc
            self._close(exc)
            raise
        try:
            self._close(None)
        except BaseException as exc:
            self.failed = exc
            raise

    def abandon(self) -> None:
        """Drop everything written so far; ``path`` is left untouched."""
        if self._out is not None:
            self._close(RuntimeError("execution trace abandoned"))

    def _require_open(self) -> Any:
        if self._out is None:
            raise RuntimeError(f"execution trace {self.path!r} is already finished")
        return self._out

    def _close(self, error: Optional[BaseException]) -> None:
        self._out = None
        if error is None:
            self._context.__exit__(None, None, None)
        else:
            self._context.__exit__(type(error), error, error.__traceback__)
