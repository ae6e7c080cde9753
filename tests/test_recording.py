"""The collector protocol, the Recording object, and sessions never edited after build."""

from __future__ import annotations

import json

import pytest
import torch

import opscope
from opscope.collect import Collector, choose_collector
from opscope.collect.recording import Recording
from opscope.model.records import RawSession


def test_each_collector_follows_the_protocol(collector_name):
    collector = choose_collector()
    assert isinstance(collector, Collector) and collector.name == collector_name


def test_recording_fills_the_raw_session(collector_name):
    marks = []

    def take_marks(collector, start_ns, stop_ns):
        marks.append((collector, start_ns <= stop_ns))
        return [(start_ns, 1, "m")]

    wired = []
    collector = choose_collector()
    rec = Recording(collector, profile_memory=True, with_modules=True, metadata={"k": "1"},
                    wire=wired.append, take_marks=take_marks)
    rec.start()
    assert rec.running and wired == [collector]
    rec.metadata["late"] = '"x"'
    torch.nn.Linear(2, 2)(torch.ones(1, 2))
    raw = rec.stop()
    assert isinstance(raw, RawSession) and not rec.running and wired == [collector, None]
    assert raw.metadata == {"k": "1", "late": '"x"'}
    assert marks == [(collector, True)] and [m[2] for m in raw.marks] == ["m"]
    assert raw.memory_sightings is not None and len(raw.memory_sightings) > 0
    assert any("Linear" in name for name in raw.modules) and raw.module_calls


def test_discard_never_raises_and_keeps_nothing(collector_name):
    rec = Recording(choose_collector(), profile_memory=True, with_modules=True)
    rec.discard()  # before start: nothing to undo
    rec.start()
    rec.discard()
    assert not rec.running
    rec.discard()  # twice: still nothing


def test_metadata_after_stop_gives_a_new_session(native_only, tmp_path):
    with opscope.profile() as prof:
        torch.ones(2).add(1)
    before = prof.session
    before.derived("n", lambda s: len(s.table))
    prof.add_metadata("late", "value")
    after = prof.session
    assert after is not before and "late" not in before.metadata
    assert after.metadata["late"] == '"value"' and after._derived == {}
    assert after.table is before.table
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    assert json.loads((tmp_path / "t.json").read_text())["late"] == "value"


def test_metadata_while_recording_goes_into_the_session(native_only):
    with opscope.profile() as prof:
        prof.add_metadata_json("during", "[1, 2]")
    assert prof.session.metadata["during"] == "[1, 2]"


@pytest.mark.parametrize("method", ["export_chrome_trace", "export_stacks", "export_report"])
def test_exports_read_the_session_only(native_only, tmp_path, method):
    with opscope.profile() as prof:
        torch.ones(2).add(1)
    session = prof.session
    metadata = dict(session.metadata)
    getattr(prof, method)(str(tmp_path / "out"))
    assert prof.session is session and session.metadata == metadata
