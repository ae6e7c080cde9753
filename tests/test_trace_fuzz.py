"""Fuzzing the trace loader with mutated real traces: only TraceLoadError may escape.

The seeds are real traces: opscope's own (a tiny train step with
record_shapes, with_stack and profile_memory), one torch.profiler writes in
the test, and the torch 2.13 sample in the shared reference folder. A seeded
loop mutates them (field types swapped for str/int/float/list/dict/null,
huge and non-finite numbers, keys deleted, events duplicated and reordered,
bytes truncated and flipped, the gzip of a seed damaged). Every mutant must either raise
``TraceLoadError`` with a specific message (not the loader's last-resort
"malformed trace" net) or load; a loaded one must render as a key_averages table
and a diff against its seed, and one in ``REPORT_EVERY`` as the HTML report
(the page builder, in memory), which keeps the whole run under a minute.
"""

from __future__ import annotations

import copy
import gzip
import json
import random

import pytest
import torch

import opscope
from opscope.analysis.diff import diff_sessions
from opscope.analysis.build import load_session
from opscope.analysis.ranks.facts import rank_facts
from opscope.load.ranks import RankTraceError
from opscope.load import TraceLoadError
from opscope.cli.table import session_table
from opscope.export.diff_text import format_diff
from opscope.report import render_html, report_data

from conftest import reference_dir

MUTANTS_PER_SEED = 1000
REPORT_EVERY = 10
HUGE = "__HUGE_LITERAL__"  # replaced by a JSON number literal that overflows a float
ODD_VALUES = [None, True, -1, 0, 2 ** 70, -2 ** 70, 1.5, float("nan"), float("inf"),
              "", "x", "\x1b[31m", "\ud800", [], [1, "a"], {}, {"a": [None]}, HUGE]


def _tiny_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return step


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """name -> (trace JSON text, its loaded session)."""
    folder = tmp_path_factory.mktemp("seeds")
    step = _tiny_step()
    step()
    with opscope.profile(record_shapes=True, with_stack=True, profile_memory=True) as prof:
        with opscope.record_function("step"):
            step()
    prof.export_chrome_trace(str(folder / "opscope.json"))
    import torch.profiler

    with torch.profiler.profile(record_shapes=True, profile_memory=True) as tprof:
        step()
    tprof.export_chrome_trace(str(folder / "torch.json"))
    sample = json.loads((reference_dir() / "trace_sample.json").read_text())
    events = [e for group in sample.pop("traceEventsSample").values() for e in group]
    sample.pop("eventCountsByPhCat", None)
    (folder / "sample.json").write_text(json.dumps({**sample, "traceEvents": events}))
    out = {}
    for name in ("opscope", "torch", "sample"):
        path = folder / f"{name}.json"
        out[name] = (path.read_text(), load_session(str(path)))
    return out


def _odd(rng: random.Random):
    return copy.deepcopy(rng.choice(ODD_VALUES))


def _mutate_doc(doc: dict, rng: random.Random) -> None:
    """Change one to three things in the parsed trace, in place."""
    events = doc["traceEvents"]
    for _ in range(rng.randint(1, 3)):
        how = rng.randrange(8)
        if not events or how == 0:
            key = rng.choice(sorted(doc))
            doc[key] = _odd(rng)
            if key == "traceEvents":
                return
            continue
        i = rng.randrange(len(events))
        event = events[i]
        if how == 1:
            events.insert(rng.randrange(len(events) + 1), copy.deepcopy(event))
        elif how == 2:
            rng.shuffle(events)
        elif how == 3:
            events[i] = _odd(rng)
        elif not isinstance(event, dict):
            continue
        elif how == 4 and event:
            del event[rng.choice(sorted(event))]
        elif how == 5 or not isinstance(event.get("args"), dict) or not event["args"]:
            event[rng.choice(sorted(event) or ["ts"])] = _odd(rng)
        else:
            args = event["args"]
            key = rng.choice(sorted(args))
            value = args[key]
            if isinstance(value, list) and value and rng.random() < 0.5:
                value[rng.randrange(len(value))] = _odd(rng)
            else:
                args[key] = _odd(rng)


def _mutant_text(text: str, rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.7:
        doc = json.loads(text)
        _mutate_doc(doc, rng)
        out = json.dumps(doc).replace(json.dumps(HUGE), "1e400")
        return out.encode("utf-8", "surrogatepass")
    if kind < 0.78:  # gzip, then damaged: truncated, a byte flipped, or trailing junk
        packed = bytearray(gzip.compress(text.encode(), compresslevel=1))
        damage = rng.randrange(3)
        if damage == 0:
            return bytes(packed[: rng.randrange(len(packed))])
        if damage == 1:
            packed[rng.randrange(len(packed))] ^= 1 << rng.randrange(8)
            return bytes(packed)
        return bytes(packed) + rng.choice([b"\0" * 7, b"junk", packed[:5]])
    data = bytearray(text.encode())
    if kind < 0.88:
        return bytes(data[: rng.randrange(len(data))])
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def _renders(session, seed_session, with_report: bool) -> None:
    assert isinstance(session_table(session, row_limit=-1), str)
    for group_by in ("shape", "stack:2"):
        from opscope.cli.table import parse_group_by
        session_table(session, row_limit=5, group_by=parse_group_by(group_by))
    assert format_diff(diff_sessions(seed_session, session), names=("a", "b"))
    if with_report:
        page = render_html(report_data(session, title="mutant"))
        assert page.startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("name", ["opscope", "torch", "sample"])
def test_mutated_traces_load_or_raise_trace_load_error(seeds, tmp_path, name):
    text, seed_session = seeds[name]
    rng = random.Random(f"opscope-fuzz-{name}")
    path = tmp_path / "mutant.json"
    loaded = refused = 0
    for k in range(MUTANTS_PER_SEED):
        data = _mutant_text(text, rng)
        path.write_bytes(data)
        try:
            session = load_session(str(path))
        except TraceLoadError as exc:
            assert "\n" not in str(exc)
            assert str(exc).startswith(f"trace {str(path)!r}: ")
            # the loader's last-resort net is not how these seeds' mutants are refused:
            # each refusal says what is wrong (a field, the JSON, the gzip)
            assert "malformed trace" not in str(exc), (k, str(exc))
            refused += 1
            continue
        except Exception as exc:  # report the mutant that broke the loader
            (tmp_path / "failing.json").write_bytes(data)
            raise AssertionError(f"mutant {k} of {name}: {type(exc).__name__}: {exc}; "
                                 f"kept in {tmp_path / 'failing.json'}") from exc
        loaded += 1
        try:
            _renders(session, seed_session, with_report=loaded % REPORT_EVERY == 0)
        except Exception as exc:
            (tmp_path / "failing.json").write_bytes(data)
            raise AssertionError(f"mutant {k} of {name} loaded but did not render: "
                                 f"{type(exc).__name__}: {exc}") from exc
    assert loaded and refused  # both outcomes were exercised


@pytest.mark.parametrize("name", ["opscope", "torch"])
def test_mutated_traces_read_lean_as_they_read_whole(seeds, tmp_path, name):
    """A lean load (``opscope ranks``: only the collectives' args parsed) of each mutant
    loads the same events as the full load, or both refuse it in one line; a loaded
    mutant's rank facts are made, or refused as a RankTraceError."""
    text, _ = seeds[name]
    rng = random.Random(f"opscope-lean-fuzz-{name}")
    path = tmp_path / "mutant.json"
    outcomes = set()
    for k in range(MUTANTS_PER_SEED // 2):
        data = _mutant_text(text, rng)
        path.write_bytes(data)
        got = []
        for lean in (False, True):
            try:
                got.append(load_session(str(path), lean=lean))
            except TraceLoadError as exc:
                assert "\n" not in str(exc)
                got.append(str(exc))
        full, lean_session = got
        if isinstance(full, str) or isinstance(lean_session, str):
            # the full load also reads every op's args: it may refuse what a lean load takes
            assert isinstance(full, str), (k, lean_session)
            outcomes.add("refused")
            continue
        assert len(lean_session.table) == len(full.table), k
        if str(2 ** 70).encode() in data:  # orjson (where installed) makes it a float;
            outcomes.add("past 64 bits")   # msgspec and json keep the integer
            continue
        assert lean_session.table.symbols.names == full.table.symbols.names, k
        assert lean_session.table.start_ns.tolist() == full.table.start_ns.tolist(), k
        try:
            facts = rank_facts(lean_session, str(path), 0)
        except RankTraceError:
            outcomes.add("facts refused")
            continue
        assert facts == rank_facts(full, str(path), 0), k
        outcomes.add("loaded")
    assert {"refused", "loaded"} <= outcomes
