"""A Python thread that recorded ops and ended before stop keeps its name (issue 27, 28)."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import opscope
from opscope.collect.thread_names import ThreadNames


@pytest.mark.parametrize("collector", ["native", "python"])
def test_a_thread_that_ended_before_stop_keeps_its_name(tmp_path, monkeypatch, collector):
    monkeypatch.setenv("OPSCOPE_COLLECTOR", collector)

    def worker():
        torch.ones(3) + 1

    with opscope.profile() as prof:
        torch.ones(3) * 2
        thread = threading.Thread(target=worker, name="loader-7")
        thread.start()
        thread.join(30)
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert names[thread.native_id] == "loader-7"
    assert threading.Thread.start.__name__ == "start"  # the watch ended with the recording


def test_a_renamed_thread_keeps_its_last_name_and_unwatched_threads_are_not_noted():
    names = ThreadNames()
    names.start()
    thread = threading.Thread(target=lambda: None, name="first")
    thread.start()
    thread.join()
    thread.name = "second"
    seen = names.names()
    assert seen[thread.native_id] == "second"
    later = threading.Thread(target=lambda: None, name="after")
    later.start()
    later.join()
    assert names._started[-1][2] == "first"  # no note after names()
