"""The registry of output formats: every entry writes, and everything writes through it."""

from __future__ import annotations

import os

import pytest
import torch

import opscope
from opscope.cli.results import OUTPUTS, REPORT
from opscope.outputs import FORMATS, format_for_path, get_format
from opscope.handlers import HANDLER_FORMATS

from synthetic import Op, make_session


@pytest.fixture(scope="module")
def session():
    return make_session([Op("aten::add", 0, 10_000), Op("aten::mul", 20_000, 5_000)])


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_entry_writes_a_file_for_each_extension(name, session, tmp_path):
    fmt = FORMATS[name]
    assert callable(fmt.write) and fmt.extensions and fmt.description
    assert fmt.suffix == fmt.extensions[0]
    assert all(isinstance(need, str) for need in fmt.needs + fmt.uses)
    for i, extension in enumerate(fmt.extensions):
        path = tmp_path / f"out{i}{extension}"
        fmt(session, str(path))
        assert path.stat().st_size > 0, (name, extension)


@pytest.fixture(scope="module")
def live_profile():
    with opscope.profile(profile_memory=True, with_stack=True, with_modules=True) as prof:
        torch.nn.Linear(2, 2)(torch.ones(1, 2))
    return prof


@pytest.mark.parametrize("name", list(FORMATS))
def test_profile_export_writes_each_entry(name, live_profile, tmp_path):
    """A new entry needs no new profile method: ``export(path, format=name)`` writes it."""
    for i, extension in enumerate(FORMATS[name].extensions):
        path = tmp_path / f"out{i}{extension}"
        live_profile.export(str(path), format=name)
        assert path.stat().st_size > 0, (name, extension)


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_extension_leads_to_a_format_that_writes_it(name):
    for extension in FORMATS[name].extensions:
        assert extension in format_for_path("x" + extension).extensions


def test_the_cli_and_handlers_write_only_registered_formats():
    outputs = OUTPUTS + [REPORT]
    named = [(o.format, o.suffix) for o in outputs] + list(HANDLER_FORMATS.values())
    for format_name, suffix in named:
        assert format_name in FORMATS
        assert FORMATS[format_name].matches("x" + suffix), (format_name, suffix)
    assert {o.format for o in outputs} == {f for f, _ in HANDLER_FORMATS.values()}


def test_unknown_format_and_extension_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown export format 'svg'"):
        get_format("svg")
    with pytest.raises(ValueError, match="no export format writes"):
        format_for_path(tmp_path / "x.csv")


def test_profile_export_follows_the_extension(native_only, tmp_path):
    with opscope.profile(profile_memory=True) as prof:
        torch.ones(3).add(1)
    for name in ("t.json", "t.json.gz", "s.stacks", "r.html", "m.raw.json.gz"):
        prof.export(str(tmp_path / name))
    prof.export(str(tmp_path / "m.html"), format="memory_timeline", device="cpu")
    assert sorted(os.listdir(tmp_path)) == ["m.html", "m.raw.json.gz", "r.html", "s.stacks",
                                            "t.json", "t.json.gz"]
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert "<svg" in (tmp_path / "m.html").read_text()


def test_a_format_needing_an_option_names_it(native_only, tmp_path):
    with opscope.profile() as prof:
        torch.ones(3).add(1)
    with pytest.raises(ValueError, match=r"^export_memory_timeline needs profile_memory=True"):
        prof.export(str(tmp_path / "m.raw.json.gz"))
    assert os.listdir(tmp_path) == []
