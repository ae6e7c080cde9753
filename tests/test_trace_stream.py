"""The streaming trace reader gives the RawSession that parsing the whole document gives.

The oracle is ``trace_session(read_trace_document(path), path)``: the document
parsed whole, then the same column building as one batch. Every trace under
the shared reference folder and tests/torch_traces, traces opscope and
torch.profiler write with every option, and layouts that stress the batching
(compact, indented, array format, gzip, keys after the events, a repeated
``traceEvents``, strings holding ``},``) must give equal sessions, also with
chunks so small that every event spans several. Malformed files give the same
one-line errors. Memory: the peak grows with the events' columns, not with the
JSON text.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import opscope
from opscope.load import TraceLoadError, read_trace
from opscope.load import trace_stream
from opscope.load.trace_events import trace_session
from opscope.load.trace_file import read_trace_document
from opscope.load.trace_stream import stream_trace

from conftest import reference_dir
from memory_peak import traced_peak

TESTS = Path(__file__).resolve().parent


def _whole(path: str):
    """The oracle: the document parsed whole, then one batch."""
    try:
        return trace_session(read_trace_document(path), path)
    except TraceLoadError as exc:
        return str(exc)


def _streamed(path: str):
    try:
        return stream_trace(path)
    except TraceLoadError as exc:
        return str(exc)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and \
            all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    return a == b


def assert_same_session(path: str) -> None:
    whole, streamed = _whole(path), _streamed(path)
    if isinstance(whole, str) or isinstance(streamed, str):
        assert whole == streamed
        return
    differ = [f.name for f in dataclasses.fields(whole)
              if not _same(getattr(whole, f.name), getattr(streamed, f.name))]
    assert not differ, f"{path}: fields differ: {differ}"


def _step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return step


ALL_ON = dict(record_shapes=True, profile_memory=True, with_stack=True, with_flops=True,
              with_modules=True)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Traces opscope and torch.profiler write (plain and with every option), and
    re-layouts of one that stress the batching; name -> path."""
    folder = tmp_path_factory.mktemp("stream")
    step = _step()
    step()
    out = {}
    for name, kw in (("plain", {}), ("all", ALL_ON)):
        with opscope.profile(**kw) as prof:
            for _ in range(2):
                step()
        out[f"opscope_{name}"] = str(folder / f"opscope_{name}.json")
        prof.export_chrome_trace(out[f"opscope_{name}"])
        with torch.profiler.profile(**kw) as tprof:
            for _ in range(2):
                step()
                tprof.step()
        out[f"torch_{name}"] = str(folder / f"torch_{name}.json")
        tprof.export_chrome_trace(out[f"torch_{name}"])
    doc = json.load(open(out["torch_all"]))
    events = doc["traceEvents"]
    layouts = {
        "compact.json": json.dumps(doc, separators=(",", ":")),
        "indented.json": json.dumps(doc, indent=3),
        "array.json": json.dumps(events),
        "keys_after.json": json.dumps({"traceEvents": events,
                                       **{k: v for k, v in doc.items() if k != "traceEvents"}}),
        "repeated.json": json.dumps({"traceEvents": events[:5], "x": 1})[:-1]
        + ', "traceEvents": ' + json.dumps(events) + "}",
        "tricky.json": json.dumps({**doc, "traceEvents": [
            {**e, "name": str(e.get("name")) + '},{"ph": "X"}, ]'} if i % 3 == 0 else e
            for i, e in enumerate(events)]}, indent=1),
    }
    for name, text in layouts.items():
        out[name] = str(folder / name)
        Path(out[name]).write_text(text)
    out["gzip"] = str(folder / "t.json.gz")
    with gzip.open(out["gzip"], "wt") as f:
        json.dump(doc, f)
    return out


def _reference_traces():
    found = []
    try:
        found += sorted(str(p) for p in reference_dir().glob("*.json"))
    except pytest.skip.Exception:
        pass
    found += sorted(str(p) for p in (TESTS / "torch_traces").glob("*.json.gz"))
    return found


@pytest.mark.parametrize("path", _reference_traces(), ids=os.path.basename)
def test_reference_traces_stream_to_the_same_session(path):
    assert_same_session(path)


@pytest.mark.parametrize("name", ["opscope_plain", "opscope_all", "torch_plain", "torch_all",
                                  "compact.json", "indented.json", "array.json",
                                  "keys_after.json", "repeated.json", "tricky.json", "gzip"])
def test_written_traces_stream_to_the_same_session(written, name):
    assert_same_session(written[name])


@pytest.mark.parametrize("chunk", [7, 64, 4096])
@pytest.mark.parametrize("name", ["opscope_all", "torch_all", "tricky.json", "gzip",
                                  "repeated.json"])
def test_small_chunks_split_every_event_and_change_nothing(written, name, chunk, monkeypatch):
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", chunk)
    assert_same_session(written[name])


def test_read_trace_is_the_streaming_reader(written):
    raw = read_trace(written["torch_all"])
    assert _same(raw, stream_trace(written["torch_all"]))
    assert raw.python_functions == "counted" and len(raw.records) > 100


MALFORMED = [
    '{"traceEvents": [1, 2,]}', '{"traceEvents": [{"a": 1}] } x', '{"a": 1}',
    '{"traceEvents": {}}', "", "   \n", '{"traceEvents": [', '[]', '{"traceEvents": []}',
    '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1} {"b": 2}]}',
    '{"traceEvents": [3, {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": "x"}]}',
    '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "soon", "dur": 1}]}',
    '{"traceEvents": [], "traceEvents": 5}', '{"traceEvents" 1}', '{"a": 1,}',
    '\ufeff{"traceEvents": []}', '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "\\ud800"'
    ', "ts": 1, "dur": 1}]}', '{"traceEvents": [[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]}',
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_files_give_the_same_outcome(tmp_path, text):
    path = tmp_path / "t.json"
    path.write_text(text, encoding="utf-8")
    assert_same_session(str(path))
    whole = _whole(str(path))
    assert isinstance(whole, str) == isinstance(_streamed(str(path)), str)


def test_bytes_that_are_not_utf8_become_replacement_characters(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a\xff", '
                     b'"ts": 1, "dur": 1}]}')
    assert stream_trace(str(path)).names == ["a\ufffd"]
    assert_same_session(str(path))


def synthetic_trace(path: str, events: int) -> int:
    """A torch-format trace of ``events`` nested ops with inputs; its size in bytes."""
    line = ('{"ph": "X", "cat": "cpu_op", "name": "aten::%s", "pid": 1, "tid": 1, '
            '"ts": %.3f, "dur": 1.5, "args": {"External id": %d, "Input Dims": [[64, %d], '
            '[%d]], "Input type": ["float", "float"], "Concrete Inputs": ["", ""]}}')
    names = ("mm", "add", "relu", "copy_", "view")
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "record_shapes": 1, "traceEvents": [\n')
        f.write(",\n".join(line % (names[i % 5], 2.0 * i, i, i % 7, i % 5)
                           for i in range(events)))
        f.write("\n]}\n")
    return os.path.getsize(path)


def test_peak_memory_is_the_columns_not_the_text(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 256 * 1024)
    small, big = str(tmp_path / "small.json"), str(tmp_path / "big.json")
    synthetic_trace(small, 10_000)
    synthetic_trace(big, 40_000)
    stream_trace(small)  # imports and caches outside the measurement
    grows = traced_peak(lambda: stream_trace(big)) - traced_peak(lambda: stream_trace(small))
    # the peak is one batch of JSON objects plus the columns (tens of bytes an event);
    # parsing the document whole holds every event's objects at once
    assert grows < 30_000 * 200
    whole, streamed = (traced_peak(lambda: read_trace_document(big)),
                       traced_peak(lambda: stream_trace(big)))
    assert whole > 3 * streamed
