"""A torch.profiler trace of N events, made from a real one: to time loading torch's layout.

torch.profiler cannot record 10M events on a 24 GB host (it holds about 4.7 KB an
event before export). This records a real ``torch.profiler`` trace of a
``torch.add`` loop (``SEED`` ops), then writes it out again with its ``cpu_op``
events repeated, each copy shifted in time past the one before (and its
``External id`` and ``Ev Idx`` past the copy before), until the file holds N op
events. Everything else is torch's own: the keys, the metadata events, the
``PyTorch Profiler (0)`` range (stretched over all the copies) and the instant
events, in torch's order and number format. Written gzip'd, streamed.

    python bench/torch_layout_trace.py OUT.json.gz 10000000
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
SEED = 20_000  # ops recorded by the real torch.profiler


def record_seed(ops: int = SEED) -> dict:
    """A real torch.profiler trace of ``ops`` calls of ``torch.add``, as a dict."""
    import torch

    a, b = torch.ones(4), torch.ones(4)
    with torch.profiler.profile() as prof:
        for _ in range(ops):
            torch.add(a, b)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "seed.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            return json.load(f)


def _op_line(event: dict, shift_us: float, ids: int) -> str:
    args = dict(event["args"])
    for key in ("External id", "Ev Idx"):
        if key in args:
            args[key] += ids
    return (f'{{"ph": "X", "cat": "cpu_op", "name": {json.dumps(event["name"])}, '
            f'"pid": {event["pid"]}, "tid": {event["tid"]}, '
            f'"ts": {event["ts"] + shift_us:.3f}, "dur": {event["dur"]:.3f}, '
            f'"args": {json.dumps(args)}}}')


def write(path: str, events: int, seed: dict) -> int:
    """Write ``seed`` with its cpu_op events repeated up to ``events`` of them to ``path``
    (gzip); returns the op events written."""
    trace = seed["traceEvents"]
    ops = [e for e in trace if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    rest = [e for e in trace if not (e.get("ph") == "X" and e.get("cat") == "cpu_op")]
    first = min(e["ts"] for e in ops)
    span = max(e["ts"] + e["dur"] for e in ops) - first + 1.0
    copies = -(-events // len(ops))
    ids = max(e["args"].get("External id", 0) for e in ops) + 1
    total_span = span * copies
    written = 0
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as out:
        head = {k: v for k, v in seed.items() if k not in ("traceEvents", "traceName")}
        out.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        out.write(",\n".join(json.dumps(e) for e in rest if e.get("ph") == "M"))
        for k in range(copies):
            lines = [_op_line(e, k * span, k * ids) for e in ops[:events - written]]
            written += len(lines)
            out.write(",\n" + ",\n".join(lines))
        for e in rest:
            if e.get("ph") == "M":
                continue
            e = dict(e)
            if e.get("ph") == "X":  # the profiler's own range: over every copy
                e["dur"] = round(e["dur"] + total_span - span, 3)
            elif e.get("name") == "Record Window End":
                e["ts"] = round(e["ts"] + total_span - span, 3)
            out.write(",\n" + json.dumps(e))
        out.write(f'\n], "traceName": {json.dumps(seed.get("traceName", ""))}}}\n')
    return written


def main() -> None:
    path, events = sys.argv[1], int(sys.argv[2])
    print(f"{write(path, events, record_seed()):,} op events in {path}")


if __name__ == "__main__":
    main()
