"""A store is at most 1/20 of its JSON trace (issue 27, item 29).

Ids and ordered times are written delta-encoded, the rest dictionary-encoded, all zstd
(``opscope.store.schema.parquet_options``). A real trace of a small CNN trained for 100
steps with shapes and modules recorded (about 50k events) must convert to a store of at
most 1/20 of its JSON; it was about 1/15.
"""

from __future__ import annotations

import os

import pytest
import torch

import opscope

pytest.importorskip("pyarrow")


def folder_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
               for f in files)


def test_store_is_at_most_a_twentieth_of_the_trace(tmp_path):
    import pyarrow.parquet as pq

    from opscope.analysis.build import load_session
    from opscope.store.write import StoreWriter

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3),
                              torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 12 * 12, 32), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(net.parameters())
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    with opscope.profile(record_shapes=True, with_modules=True) as prof:
        for _ in range(100):
            loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    trace = tmp_path / "t.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    with StoreWriter(tmp_path / "s") as writer:
        writer.write_window(load_session(trace))
    ratio = os.path.getsize(trace) / folder_bytes(tmp_path / "s")
    print(f"trace {os.path.getsize(trace):,} B, store 1/{ratio:.1f}")
    assert ratio >= 20, ratio
    events = pq.ParquetFile(tmp_path / "s" / "events" / "rank=0" / "window=0" / "part-0.parquet")
    column = events.metadata.row_group(0).column(events.schema_arrow.names.index("start_ns"))
    assert "DELTA_BINARY_PACKED" in column.encodings
