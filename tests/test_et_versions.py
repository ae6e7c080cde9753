"""The execution trace in the format of each torch version (writer.FORMATS).

The full comparison with torch's own observer is in test_execution_trace.py,
which runs in each venv of the compatibility matrix; here each format is
checked on synthetic nodes, and the installed torch is asked which it writes.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ExecutionTraceObserver as TorchExecutionTraceObserver

from opscope.execution_trace.writer import (FORMATS, ExecutionTraceWriter, format_for,
                                            torch_version)

PORT = ('[[5,6,0,4,4,"cpu"]]', "[[2,2]]", '["Tensor(float)"]', "[[2,1]]")
NODE = (4, "aten::relu", 3, 7, 0, 2, 0, 1, 0, "aten::relu(Tensor self) -> Tensor", PORT, PORT)


def _write(tmp_path, fmt) -> str:
    path = tmp_path / "et.json"
    writer = ExecutionTraceWriter(str(path), fmt)
    writer.write_nodes([NODE])
    writer.finish()
    return path.read_text()


def test_torch_2_4_format_has_no_strides_nor_tensor_range(tmp_path):
    text = _write(tmp_path, format_for((2, 4)))
    doc = json.loads(text)
    assert doc["schema"] == "1.1.0-chakra.0.0.4"
    node = doc["nodes"][0]
    assert list(node["inputs"]) == list(node["outputs"]) == ["values", "shapes", "types"]
    assert [a["name"] for a in node["attrs"]][-1] == "kernel_file"
    assert '\n  "nodes": [\n    {\n      "id": 4,' in text  # torch 2.4's indentation
    assert text.rstrip().endswith('"value": ""}]\n    }\n  ],\n  "finish_ts": ' +
                                  str(doc["finish_ts"]) + "\n}")


@pytest.mark.parametrize("version", [(2, 8), (2, 13), (2, 15)])
def test_later_formats_have_strides_and_tensor_range(tmp_path, version):
    text = _write(tmp_path, format_for(version))
    doc = json.loads(text)
    assert doc["schema"] == "1.1.1-chakra.0.0.4"
    node = doc["nodes"][0]
    assert node["inputs"]["strides"] == [[2, 1]]
    assert [a["name"] for a in node["attrs"]][-1] == "tensor_range"
    assert '\n  "nodes": [\n      {\n        "id": 4,' in text


def test_every_format_writes_the_same_nodes_apart_from_its_fields(tmp_path):
    old, new = (json.loads(_write(tmp_path, fmt))["nodes"] for fmt in FORMATS[:2])
    for a, b in zip(old, new):
        assert {k: v for k, v in a.items() if k not in ("inputs", "outputs", "attrs")} == \
               {k: v for k, v in b.items() if k not in ("inputs", "outputs", "attrs")}
        assert a["attrs"] == [x for x in b["attrs"] if x["name"] != "tensor_range"]


def test_versions_before_the_first_known_use_the_oldest_format():
    assert format_for((1, 13)) is FORMATS[0]
    assert format_for((3, 0)) is FORMATS[-1]


def test_torch_version_reads_local_and_prerelease_versions(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.4.0a0+git1234")
    assert torch_version() == (2, 4)
    monkeypatch.setattr(torch, "__version__", "not a version")
    assert torch_version() == (0, 0)


def test_writer_uses_the_schema_of_the_installed_torchs_observer(tmp_path):
    """torch's own observer says which schema the installed torch writes."""
    observer = TorchExecutionTraceObserver().register_callback(str(tmp_path / "torch.json"))
    try:
        observer.start()
        torch.ones(2).relu()
        observer.stop()
    finally:
        observer.unregister_callback()
    with open(tmp_path / "torch.json") as f:
        theirs = json.load(f)
    ours = ExecutionTraceWriter(str(tmp_path / "ours.json"))
    ours.finish()
    assert ours.format.schema == theirs["schema"]
    op = next(n for n in theirs["nodes"] if n["name"] == "aten::relu")
    assert ("strides" in op["inputs"]) is ours.format.strides
    assert any(a["name"] == "tensor_range" for a in op["attrs"]) is ours.format.tensor_range


def test_storages_at_reused_addresses_get_torchs_ids(tmp_path):
    """Freed tensors whose memory comes back at the same address: each torch numbers
    those storages its own way (by address, or one id per storage on torch 2.8)."""
    import opscope
    from opscope.execution_trace import load_execution_trace

    def churn():
        for _ in range(8):
            x = torch.empty(4096)
            x.neg_()
            del x

    churn()
    ours = opscope.ExecutionTraceObserver().register_callback(str(tmp_path / "ours.json"))
    theirs = TorchExecutionTraceObserver().register_callback(str(tmp_path / "torch.json"))
    try:
        theirs.start()
        ours.start()
        churn()
        ours.stop()
        theirs.stop()
    finally:
        theirs.unregister_callback()
        ours.unregister_callback()
    got, want = (load_execution_trace(str(tmp_path / name))["nodes"]
                 for name in ("ours.json", "torch.json"))
    assert len(got) == len(want) >= 16
    assert got == want
