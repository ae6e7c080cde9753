"""``opscope table TRACE``: the key_averages table of a saved trace.

The oracle is the live profile's own table (``prof.key_averages().table()``),
or torch.profiler's for its traces. Output checks call the CLI in-process
(fast); the error cases run it in a subprocess, as users run it.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess

import pytest

import opscope
from opscope.cli.main import main

from test_cli import assert_usage_error, opscope_cli
from test_trace_loader import table_cells
from workloads import mlp_step_fn, torch_profiler_trace


def printed(text: str) -> str:
    """``text`` as the CLI prints it: ending with one newline."""
    return text if text.endswith("\n") else text + "\n"


def run_cli(capsys, *args: str):
    """``opscope ARGS`` in-process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return info.value.code, out, err


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A live profile of MLP train steps (shapes and modules on) and its trace."""
    step = mlp_step_fn()
    step()
    with opscope.profile(record_shapes=True, with_modules=True) as prof:
        for _ in range(2):
            step()
    path = str(tmp_path_factory.mktemp("table") / "mlp.pt.trace.json.gz")
    prof.export_chrome_trace(path)
    return prof, path


def test_table_equals_the_live_table(profiled, capsys):
    prof, path = profiled
    code, out, err = run_cli(capsys, "table", path)
    assert code == 0, err
    expected = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    assert out == printed(expected)


def test_sort_and_limit(profiled, capsys):
    prof, path = profiled
    code, out, _ = run_cli(capsys, "table", path, "--sort", "count", "--limit", "5")
    assert code == 0
    assert out == printed(prof.key_averages().table(sort_by="count", row_limit=5))
    rows = [line for line in out.splitlines()[3:] if line and not line.startswith(("-", "Self"))]
    assert len(rows) == 5
    counts = [int(line.split()[-1]) for line in rows]
    assert counts == sorted(counts, reverse=True)


def test_group_by_shape(profiled, capsys):
    prof, path = profiled
    code, out, _ = run_cli(capsys, "table", path, "--group-by", "shape", "--limit", "-1")
    assert code == 0
    assert out == printed(prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total", row_limit=-1))
    assert "[[16], [8, 16], [16, 16], [], []]" in out  # aten::addmm of the Linear layers


def test_group_by_module(profiled, capsys):
    prof, path = profiled
    code, out, _ = run_cli(capsys, "table", path, "--group-by", "module")
    assert code == 0
    assert out == printed(prof.module_table(row_limit=20))
    assert "head (Linear)" in out and "body.0 (Linear)" in out
    code, out, _ = run_cli(capsys, "table", path, "--group-by", "module", "--sort",
                           "cpu_time_total")
    assert code == 0
    assert out == printed(prof.module_table(sort_by="cpu_time_total", row_limit=20))


def test_group_by_stack(tmp_path, capsys):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": t,
               "dur": 1.0, "args": {"Call stack": f"{frame};main.py(1): <module>;"}}
              for t, frame in ((0.0, "a.py(3): f"), (2.0, "b.py(4): g"), (4.0, "a.py(3): f"))]
    path = tmp_path / "stacks.json"
    path.write_text(json.dumps({"traceEvents": events}))
    code, out, _ = run_cli(capsys, "table", str(path), "--group-by", "stack:1")
    assert code == 0
    rows = [line for line in out.splitlines() if line.lstrip().startswith("aten::add")]
    assert len(rows) == 2, out
    assert "Source Location" in out
    counts = {("a.py(3): f" if "a.py(3): f" in row else "b.py(4): g"): row.split()[6]
              for row in rows}
    assert counts == {"a.py(3): f": "2", "b.py(4): g": "1"}


@pytest.mark.parametrize("group_by, words", [
    ("module", ["no module data", "--modules", "with_modules=True"]),
    ("stack:2", ["no Python stacks", "--stack"]),
    ("shape", ["no input shapes", "--record-shapes"]),
])
def test_group_by_without_the_data_is_one_line_error(tmp_path, capsys, group_by, words):
    step = mlp_step_fn()
    with opscope.profile() as prof:
        step()
    path = str(tmp_path / "plain.json")
    prof.export_chrome_trace(path)
    code, out, err = run_cli(capsys, "table", path, "--group-by", group_by)
    assert out == ""
    assert_usage_error(subprocess.CompletedProcess([], code, out, err), path, *words)


@pytest.mark.parametrize("args, words", [
    (["--sort", "flops"], ["--sort", "no FLOPs", "--flops"]),
    (["--sort", "self_cpu_memory_usage"], ["--sort", "no memory", "--memory"]),
    (["--group-by", "module", "--sort", "flops"], ["--sort", "no FLOPs"]),
])
def test_sort_by_data_the_trace_lacks_is_one_line_error(profiled, capsys, args, words):
    """The profiled trace has shapes and modules, but no FLOPs and no memory."""
    _, path = profiled
    code, out, err = run_cli(capsys, "table", path, *args)
    assert out == ""
    assert_usage_error(subprocess.CompletedProcess([], code, out, err), path, *words)


def test_sort_by_flops_when_recorded(tmp_path, capsys):
    step = mlp_step_fn()
    with opscope.profile(with_flops=True) as prof:
        step()
    path = str(tmp_path / "flops.json")
    prof.export_chrome_trace(path)
    code, out, _ = run_cli(capsys, "table", path, "--sort", "flops")
    assert code == 0 and "FLOPs" in out


@pytest.mark.parametrize("args, words", [
    (["--group-by", "stack"], ["--group-by", "stack:N"]),
    (["--group-by", "stack:0"], ["--group-by"]),
    (["--sort", "fastest"], ["--sort", "fastest"]),
    (["--group-by", "module", "--sort", "flop"], ["--sort", "module table"]),
    (["--limit", "0"], ["--limit"]),
])
def test_bad_options_are_one_line_errors(profiled, capsys, args, words):
    _, path = profiled
    code, out, err = run_cli(capsys, "table", path, *args)
    assert out == ""
    assert_usage_error(subprocess.CompletedProcess([], code, out, err), *words)


def test_tensorboard_folder(tmp_path, capsys):
    folder = tmp_path / "log"
    step = mlp_step_fn()
    with opscope.profile(on_trace_ready=opscope.tensorboard_trace_handler(str(folder))) as prof:
        step()
    code, out, _ = run_cli(capsys, "table", str(folder), "--limit", "-1")
    assert code == 0
    expected = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=-1)
    assert out == printed(expected)


def test_torch_profiler_trace_prints_torchs_table(tmp_path, capsys):
    path = str(tmp_path / "torch.json")
    prof = torch_profiler_trace(path)
    code, out, _ = run_cli(capsys, "table", path, "--sort", "cpu_time_total", "--limit", "12")
    assert code == 0
    expected = prof.key_averages().table(sort_by="cpu_time_total", row_limit=12)
    # names, sums and counts exactly; averages may differ in a halfway last digit
    assert table_cells(out) == table_cells(expected) and len(table_cells(out)) == 12


def test_trace_without_ops_says_so(tmp_path, capsys):
    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}')
    code, out, err = run_cli(capsys, "table", str(path))
    assert (code, out) == (0, "")
    assert err == f"opscope: trace {str(path)!r} has no CPU op events\n"


def test_help(capsys):
    code, out, _ = run_cli(capsys, "table", "--help")
    assert code == 0 and out.startswith("usage: opscope table")
    assert "--group-by" in out and "--sort" in out and "--limit" in out


# -- file errors: a subprocess each, as users run it ----------------------------------------

def bad_trace(folder, kind: str) -> str:
    """A file of ``kind``: missing, not_a_trace, truncated_gz, no_trace_events."""
    if kind == "missing":
        return "missing.pt.trace.json"
    if kind == "not_a_trace":
        (folder / "notes.json").write_text("Just some notes, not JSON.\n")
        return "notes.json"
    if kind == "truncated_gz":
        data = gzip.compress(json.dumps({"traceEvents": [{"ph": "X"}] * 500}).encode())
        (folder / "cut.json.gz").write_bytes(data[: len(data) // 2])
        return "cut.json.gz"
    (folder / "other.json").write_text(json.dumps({"data": [1, 2, 3]}))
    return "other.json"


FILE_ERRORS = {
    "missing": "no such file",
    "not_a_trace": "not valid JSON",
    "truncated_gz": "truncated gzip",
    "no_trace_events": "no 'traceEvents'",
}


@pytest.mark.parametrize("kind", sorted(FILE_ERRORS))
def test_bad_trace_file_is_one_line_exit_2(tmp_path, kind):
    name = bad_trace(tmp_path, kind)
    result = opscope_cli(None, "table", name, cwd=tmp_path)
    assert_usage_error(result, name, FILE_ERRORS[kind])
    assert result.stdout == ""
    assert os.listdir(tmp_path) == ([] if kind == "missing" else [name])
