"""The C trace scanner (load/trace_scan.cpp, load/trace_fast.py) reads a trace exactly as json.

Every trace is read twice, with the scanner and without it, and the two RawSessions
must be equal field by field: torch's traces of five versions, an opscope recording
of a training step, and small traces written to hit each odd case the scanner hands
back to json (escapes, a key given twice, big integers, booleans, NaN, a bad event).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from opscope.load.trace_file import TraceLoadError
from opscope.load.trace_stream import stream_trace

TORCH_TRACES = sorted((Path(__file__).parent / "torch_traces").glob("*.trace.json.gz"))


@pytest.fixture(scope="module")
def scanner():
    from opscope.analysis.trace_reading import SCANNER
    module = SCANNER.load()
    if module is None:
        pytest.skip(f"the trace scanner did not build: {SCANNER.failure_reason()}")
    return module


def assert_same(a, b) -> None:
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), field.name
        else:
            assert repr(x) == repr(y), field.name


def both_ways(path, scanner, **kwargs):
    def read(s):
        try:
            return stream_trace(str(path), scanner=s, **kwargs)
        except TraceLoadError as exc:
            return str(exc)
    plain, scanned = read(None), read(scanner)
    if isinstance(plain, str):
        assert plain == scanned
    else:
        assert_same(plain, scanned)
    return plain


@pytest.mark.parametrize("trace", TORCH_TRACES, ids=lambda p: p.name)
def test_torch_traces_read_the_same(scanner, trace, monkeypatch):
    import opscope.load.trace_stream as trace_stream
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 64 << 10)  # many batches
    both_ways(trace, scanner)


def test_an_opscope_training_step_reads_the_same(scanner, tmp_path):
    import torch

    import opscope
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opscope.profile(with_modules=True, profile_memory=True) as prof:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    path = tmp_path / "step.json.gz"
    prof.export_chrome_trace(str(path))
    raw = both_ways(path, scanner)
    assert "aten::addmm" in raw.names


def op(name="aten::add", **fields):
    event = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 7, "tid": 8, "ts": 1.5,
             "dur": 2.25, "args": {"External id": 1, "Sequence number": 3,
                                   "Fwd thread id": 0, "Record function id": 0, "Ev Idx": 0}}
    event.update(fields)
    return event


ODD_EVENTS = {
    "escaped name": '{"ph": "X", "cat": "cpu_op", "name": "a\\u00e9\\"b", "pid": 7, "tid": 8, '
                    '"ts": 1, "dur": 1}',
    "key given twice": '{"ph": "X", "cat": "cpu_op", "name": "x", "name": "y", "pid": 7, '
                       '"tid": 8, "ts": 1, "dur": 1}',
    "args key given twice": '{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 7, "tid": 8, '
                            '"ts": 1, "args": {"Sequence number": 1, "Sequence number": 2}}',
    "big pid": json.dumps(op(pid=2 ** 70)),
    "big sequence number": json.dumps(op(args={"Sequence number": 2 ** 64})),
    "bool tid": json.dumps(op(tid=True)),
    "string tid": json.dumps(op(tid="Spans")),
    "float pid": json.dumps(op(pid=7.0)),
    "no dur": json.dumps({k: v for k, v in op().items() if k != "dur"}),
    "no ts": json.dumps({k: v for k, v in op().items() if k != "ts"}),
    "no args": json.dumps({k: v for k, v in op().items() if k != "args"}),
    "ts past the bound": json.dumps(op(ts=5e15)),
    "exponent ts": '{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 7, "tid": 8, '
                   '"ts": 1.5e3, "dur": 0.1E1}',
    "long ts": json.dumps(op(ts=1234567890.1234567891)),
    "negative zero": '{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 7, "tid": 8, '
                     '"ts": -0.0, "dur": -0}',
    "shapes": json.dumps(op(args={"Input Dims": [[2, 3]], "Input type": ["float"]})),
    "stack": json.dumps(op(args={"Call stack": "a.py(1): f;"})),
    "upper-case category": json.dumps(op(cat="CPU_OP")),
    "user range": json.dumps(op(cat="user_annotation", name="## step ##")),
    "python function": json.dumps(op(cat="python_function", name="f.py(3): g")),
    "memory": json.dumps({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]",
                          "pid": 7, "tid": 8, "ts": 2, "s": "t",
                          "args": {"Addr": 1, "Bytes": 64, "Total Allocated": 64,
                                   "Total Reserved": 0, "Device Type": 0, "Device Id": -1}}),
    "thread name": json.dumps({"ph": "M", "name": "thread_name", "pid": 7, "tid": 8,
                               "args": {"name": "MainThread"}}),
    "not an object": "[1, 2]",
    "unicode name": json.dumps(op(name="é✓"), ensure_ascii=False),
    "nested args": json.dumps(op(args={"External id": {"a": [1, {"b": None}]}})),
    "NaN ts": '{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 7, "tid": 8, "ts": NaN}',
    "huge exponent": '{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 7, "tid": 8, '
                     '"ts": 1e999}',
}


@pytest.mark.parametrize("case", sorted(ODD_EVENTS))
def test_odd_events_among_plain_ops_read_the_same(scanner, tmp_path, case):
    plain = [json.dumps(op(ts=10 + k, args={"Sequence number": k})) for k in range(300)]
    events = plain[:150] + [ODD_EVENTS[case]] + plain[150:]
    text = '{"traceEvents": [\n' + ",\n".join(events) + '\n], "schemaVersion": 1}'
    path = tmp_path / "odd.json.gz"
    path.write_bytes(gzip.compress(text.encode()))
    both_ways(path, scanner)


def test_torch_like_timestamps_read_the_same(scanner, tmp_path):
    """Times as torch writes them (Unix us, 16-17 digits and 3 decimals), around 2^53 too,
    where the scanner's fast path ends: each read as json reads it."""
    rng = np.random.default_rng(7)
    near = [2 ** 53 + d for d in range(-3, 4)]  # digits around 2^53, as "9007199254740.992"
    texts = [f"{v // 1000}.{v % 1000:03d}" for v in near]
    texts += [f"{rng.integers(10 ** 12, 10 ** 13)}.{rng.integers(0, 1000):03d}"
              for _ in range(400)]
    texts += [f"{rng.integers(10 ** 13, 10 ** 14)}.{rng.integers(0, 1000):03d}"
              for _ in range(100)]  # 17 digits: past the fast path
    events = [json.dumps(op(dur=0.5, args={"Sequence number": k})).replace(
        '"ts": 1.5', f'"ts": {t}') for k, t in enumerate(texts)]
    text = '{"traceEvents": [\n' + ",\n".join(events) + '\n], "schemaVersion": 1}'
    path = tmp_path / "torch_times.json.gz"
    path.write_bytes(gzip.compress(text.encode()))
    raw = both_ways(path, scanner)
    assert len(raw.records) == len(texts)


@pytest.mark.parametrize("text", [
    '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, '
    '"ts": 1,}]}',  # a trailing comma
    '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 01, "tid": 1, '
    '"ts": 1}]}',  # a leading zero
    '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x\t", "pid": 1, "tid": 1, '
    '"ts": 1}]}',  # a raw tab in a string
])
def test_json_errors_are_the_loaders_own(scanner, tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    message = both_ways(path, scanner)
    assert isinstance(message, str) and "not valid JSON" in message


def test_plain_ops_go_through_the_scanner(scanner, tmp_path, monkeypatch):
    import opscope.load.trace_fast as trace_fast
    added = []
    real = trace_fast.add_plain
    monkeypatch.setattr(trace_fast, "add_plain",
                        lambda cols, rows, feed: added.append(len(rows)) or real(cols, rows, feed))
    events = [json.dumps(op(ts=10 + k)) for k in range(300)]
    events.insert(100, ODD_EVENTS["shapes"])
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + ",".join(events) + "]}")
    raw = stream_trace(str(path), scanner=scanner)
    # the last event closes the list: the batch is cut before it, and json reads it
    assert added == [100, 199] and len(raw.records) == 301
