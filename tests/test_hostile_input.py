"""Hostile input files for table/report/diff: bounded memory, one-line errors, safe output.

Each test feeds the CLI (a subprocess, with a timeout that kills its
process group) or the loader a file built to hurt: ``/dev/zero``, a gzip bomb,
a FIFO, a file over the size limit, wrong-typed fields, terminal escapes and
lone surrogates in op names, and ``{{DATA}}`` in a folder name.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zlib

import pytest

from opscope.analysis.build import load_session
from opscope.load import TraceLoadError
from opscope.cli.terminal import terminal_safe
from opscope.report.page import render_html

from subprocesses import run_in_group
from test_report_browser import ReportPage, artifacts, browser  # noqa: F401  (fixtures)

TIMEOUT_S = 120
GB = 2 ** 30


def _event(name, ts, dur, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def _trace(path, *names, dur=5):
    events = [_event("step", 0, 100, cat="user_annotation")]
    events += [_event(n, 1 + 10 * k, dur) for k, n in enumerate(names)]
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(json.dumps({"traceEvents": events}))
    return str(path)


def cli(*args, cwd, env=None):
    """``python -m opscope ARGS``: (exit status, stdout, stderr); the group is killed on timeout."""
    full_env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_COLLECTOR"}
    full_env.update(env or {})
    proc = run_in_group([sys.executable, "-m", "opscope", *args], cwd=cwd, env=full_env,
                        timeout=TIMEOUT_S, text=False)
    out, err = proc.stdout, proc.stderr
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def assert_one_line_exit_2(result, *words):
    status, out, err = result
    assert status == 2, (status, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])


# -- size and kind of file ----------------------------------------------------------

def _run_python(code, cwd):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=cwd, env=dict(os.environ))
    return proc.returncode, proc.stdout, proc.stderr


def _measured_cli(args, cwd):
    """Run ``opscope ARGS`` from a fresh Python, so RUSAGE_CHILDREN's peak is its alone.

    Returns (exit status, peak RSS in bytes, stderr).
    """
    code = ("import resource, subprocess, sys; "
            f"p = subprocess.run([sys.executable, '-m', 'opscope', *{list(args)!r}], "
            "capture_output=True, text=True, timeout=60); "
            "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "sys.stderr.write(p.stderr)")
    _, out, err = _run_python(code, cwd)
    status, peak_kib = out.split()
    return int(status), int(peak_kib) * 1024, err


def test_dev_zero_is_refused_quickly_with_little_memory(tmp_path):
    for verb in (["report", "/dev/zero", "-o", str(tmp_path / "r.html")],
                 ["table", "/dev/zero"]):
        status, peak, err = _measured_cli(verb, tmp_path)
        assert status == 2, err
        assert peak < GB
        lines = err.splitlines()
        assert len(lines) == 1 and "'/dev/zero'" in lines[0] and "device" in lines[0], err


def _gzip_bomb(path, inflated=GB):
    """About 1 MiB of gzip that inflates to ``inflated`` zero bytes."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * (16 * 2 ** 20)
    with open(path, "wb") as f:
        for _ in range(inflated // len(block)):
            f.write(packer.compress(block))
        f.write(packer.flush())
    return str(path)


def test_gzip_bomb_is_refused_quickly_with_little_memory(tmp_path):
    bomb = _gzip_bomb(tmp_path / "bomb.pt.trace.json.gz")
    assert os.path.getsize(bomb) < 2 * 2 ** 20
    status, peak, err = _measured_cli(["table", bomb], tmp_path)
    assert status == 2, err
    assert peak < GB
    assert len(err.splitlines()) == 1 and "bomb.pt.trace.json.gz" in err, err


def test_gzip_of_a_plausible_trace_over_the_limit_names_size_and_option(tmp_path):
    # starts like a trace, so only the inflated size can refuse it: measured, never held
    path = tmp_path / "big.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (8 * 2 ** 20) + b"]}"))
    with pytest.raises(TraceLoadError) as info:
        load_session(str(path), max_bytes=2 ** 20)
    message = str(info.value)
    assert "big.json.gz" in message and "1 MiB" in message
    assert "--max-trace-size" in message and "OPSCOPE_MAX_TRACE_BYTES" in message
    assert load_session(str(path), max_bytes=16 * 2 ** 20).table is not None


def test_gzip_bomb_that_opens_like_a_trace_is_refused_with_little_memory(tmp_path, monkeypatch):
    # 1 GiB of blanks inside a valid trace opening: only the inflation ratio gives it away
    path = tmp_path / "blank.pt.trace.json.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(path, "wb") as f:
        f.write(packer.compress(b'{"traceEvents": ['))
        block = b" " * (16 * 2 ** 20)
        for _ in range(GB // len(block)):
            f.write(packer.compress(block))
        f.write(packer.compress(b"]}") + packer.flush())
    monkeypatch.delenv("OPSCOPE_MAX_TRACE_BYTES", raising=False)
    status, peak, err = _measured_cli(["table", str(path)], tmp_path)
    assert status == 2, err
    assert peak < GB
    lines = err.splitlines()
    assert len(lines) == 1 and "blank.pt.trace.json.gz" in lines[0], err
    assert "decompression bomb" in lines[0] and "--max-trace-size" in lines[0], err


@pytest.mark.parametrize("how", ["option", "environment"])
def test_file_over_the_limit_is_one_line_naming_file_size_and_option(tmp_path, how):
    path = _trace(tmp_path / "t.json", *[f"aten::op{k}" for k in range(200)])
    size = os.path.getsize(path)
    args, env = (["--max-trace-size", "4K"], None) if how == "option" else \
        ([], {"OPSCOPE_MAX_TRACE_BYTES": "4K"})
    for verb in (["table", path], ["report", path, "-o", str(tmp_path / "r.html")],
                 ["diff", path, path]):
        result = cli(*verb, *args, cwd=tmp_path, env=env)
        assert_one_line_exit_2(result, repr(path), "4 KiB", "--max-trace-size")
        assert f"{size / 1024:.3g} KiB" in result[2]
    assert cli("table", path, "--max-trace-size", "1M", cwd=tmp_path)[0] == 0


def test_bad_size_values_are_one_line_errors(tmp_path):
    path = _trace(tmp_path / "t.json", "aten::mm")
    assert_one_line_exit_2(cli("table", path, "--max-trace-size", "lots", cwd=tmp_path),
                           "--max-trace-size", "'lots'")
    assert_one_line_exit_2(cli("table", path, cwd=tmp_path,
                               env={"OPSCOPE_MAX_TRACE_BYTES": "-3"}),
                           "OPSCOPE_MAX_TRACE_BYTES", "'-3'")


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "t.pt.trace.json"
    os.mkfifo(fifo)
    for verb in (["table", str(fifo)], ["report", str(fifo)], ["diff", str(fifo), str(fifo)]):
        assert_one_line_exit_2(cli(*verb, cwd=tmp_path), "FIFO", str(fifo))


def test_folder_without_a_trace_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    for verb in (["table", "empty"], ["report", "empty"], ["diff", "empty", "empty"]):
        assert_one_line_exit_2(cli(*verb, cwd=tmp_path), "*.pt.trace.json", "empty")


def test_text_that_does_not_start_like_json_is_refused_from_its_first_bytes(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b"\0" * 4096)
    with pytest.raises(TraceLoadError, match="does not start with"):
        load_session(str(path))
    path.write_bytes(b" " * (2 ** 20 + 10) + b"{}")
    with pytest.raises(TraceLoadError, match="blank space"):
        load_session(str(path))


def test_multi_member_gzip_and_zero_padding_load(tmp_path):
    text = json.dumps({"traceEvents": [_event("aten::mm", 0, 5)]}).encode()
    path = tmp_path / "t.json.gz"
    padding = b"\0" * (2 * 2 ** 20 + 8)  # longer than one read: still padding, as gzip allows
    path.write_bytes(gzip.compress(text[:10]) + b"\0" * 3 + gzip.compress(text[10:]) + padding)
    assert load_session(str(path)).table.name(0) == "aten::mm"


# -- wrong-typed fields ---------------------------------------------------------------

@pytest.mark.parametrize("field, value, words", [
    ("dur", "5", ["traceEvents[2].dur (event 'aten::mm')", "expected a number", "string"]),
    ("ts", None, ["traceEvents[2].ts (event 'aten::mm')", "null"]),
    ("ts", [1], ["traceEvents[2].ts (event 'aten::mm')", "array"]),
    ("ts", 2 ** 70, ["traceEvents[2].ts (event 'aten::mm')", "out of range"]),
    ("dur", float("nan"), ["traceEvents[2].dur (event 'aten::mm')", "out of range"]),
])
def test_wrong_typed_times_name_event_and_field(tmp_path, field, value, words):
    events = [_event("step", 0, 100, cat="user_annotation"), {"ph": "M", "name": "x"},
              _event("aten::mm", 1, 5)]
    events[2][field] = value
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(TraceLoadError) as info:
        load_session(str(path))
    assert str(info.value).startswith(f"trace {str(path)!r}: ")
    for word in words:
        assert word in str(info.value)
    result = cli("table", str(path), cwd=tmp_path)
    assert_one_line_exit_2(result, words[0])


def test_odd_optional_fields_load_without_them(tmp_path):
    # ids, threads, inputs and clocks of the wrong type or range are ignored, not fatal
    events = [_event("aten::mm", 1, 5, **{"Input Dims": [[2, "a"], [2 ** 70]],
                                         "Input type": ["float", {}],
                                         "Sequence number": 2 ** 70, "Fwd thread id": [1]}),
              {"ph": "M", "name": "thread_name", "tid": [1], "args": {"name": "x"}},
              {"ph": "s", "cat": "fwdbwd", "id": {"a": 1}, "tid": 1, "ts": 1},
              {"ph": "X", "cat": "Trace", "name": "w", "ts": "x", "dur": 5}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 10 ** 30, "traceEvents": events}))
    session = load_session(str(path))
    assert session.table.name(0) == "aten::mm" and session.epoch_offset_ns == 0


# -- what the CLI prints --------------------------------------------------------------

def test_escapes_and_lone_surrogates_in_names_are_printed_escaped(tmp_path):
    names = ["aten::\x1b[31mred", "bad\ud800name", "c1\x9bx\x07"]
    path = _trace(tmp_path / "t.json", *names)
    status, out, err = cli("table", path, cwd=tmp_path, env={"PYTHONIOENCODING": "utf-8"})
    assert status == 0, err
    assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out
    assert "\\x1b[31mred" in out and "\\ud800" in out and "\\x9b" in out
    slower = _trace(tmp_path / "slower.json", *names, dur=9)
    status, out, err = cli("diff", path, slower, cwd=tmp_path)
    assert status == 0, err
    assert "\x1b" not in out and "\\x1b[31mred" in out and "\\ud800" in out


def test_error_lines_escape_control_characters_in_file_names(tmp_path):
    name = "evil\x1b]0;owned\x07.json"
    status, out, err = cli("table", name, cwd=tmp_path)
    assert status == 2 and "\x1b" not in err and "\x07" not in err
    assert len(err.splitlines()) == 1 and "\\x1b]0;owned" in err


def test_terminal_safe_keeps_newlines_and_tabs_and_escapes_the_rest():
    assert terminal_safe("a\tb\nc") == "a\tb\nc"
    assert terminal_safe("\x00\x1b\x7f\x85\r\ud800") == "\\x00\\x1b\\x7f\\x85\\r\\ud800"


# -- the HTML report ------------------------------------------------------------------

def _embedded_data(page: str) -> dict:
    start = page.index('<script id="opscope-data" type="application/json">')
    start = page.index(">", start) + 1
    return json.loads(page[start:page.index("</script>", start)])


def test_placeholders_in_folder_title_and_op_names_give_a_working_report(tmp_path):
    folder = tmp_path / "x{{DATA}}y"
    folder.mkdir()
    names = ["aten::{{DATA}}", "/*{{SCRIPT}}*/ </script><!--", "{{TITLE}}"]
    trace = _trace(folder / "w.pt.trace.json", *names)
    status, out, err = cli("report", str(folder), cwd=tmp_path)
    assert status == 0, err
    page = (folder / "w.html").read_text()
    assert page.count('<script id="opscope-data"') == 1
    data = _embedded_data(page)
    assert data["meta"]["title"] == trace
    shown = {row["name"] for row in data["operators"]["rows"]}
    assert set(names) <= shown, shown
    assert page.lower().count("</script") == page.lower().count("<script")
    assert "<!--" not in page.split('<script id="opscope-data"')[1].split("</script>")[0]


def test_render_html_substitutes_each_marker_once():
    page = render_html({"meta": {"title": "{{DATA}}{{TITLE}}/*{{STYLE}}*/"}})
    data = _embedded_data(page)
    assert data["meta"]["title"] == "{{DATA}}{{TITLE}}/*{{STYLE}}*/"
    assert page.count("/*{{STYLE}}*/") == 2  # in the <title> and in the data, not replaced


def test_placeholder_report_loads_in_a_browser(tmp_path, browser, artifacts):  # noqa: F811
    folder = tmp_path / "x{{DATA}}y"
    folder.mkdir()
    trace = _trace(folder / "w.pt.trace.json", "aten::{{DATA}}</script><!--")
    assert cli("report", str(folder), cwd=tmp_path)[0] == 0
    page = ReportPage(browser, folder / "w.html", artifacts, "placeholders")
    assert page.js("window.opscopeReport.data.meta.title") == trace
    assert "aten::{{DATA}}</script><!--" in page.js(
        "window.opscopeReport.data.operators.rows.map(r => r.name)")
    page.check_clean()


def test_lone_surrogates_in_names_and_paths_still_write_html(tmp_path):
    # a folder named with a byte that is not UTF-8 decodes to a lone surrogate, as "\ud800" does
    folder = os.fsdecode(bytes(tmp_path) + b"/dir\xff")
    os.mkdir(folder)
    names = ["bad\ud800name", "aten::mm"]
    _trace(os.path.join(folder, "w.pt.trace.json"), *names)
    slower = _trace(tmp_path / "b.json", *names, dur=9)
    status, out, err = cli("report", folder, cwd=tmp_path)
    assert status == 0, err
    page = open(os.path.join(folder, "w.html"), encoding="utf-8").read()
    assert "bad\\ud800name" in json.dumps(_embedded_data(page))
    status, out, err = cli("diff", folder, slower, "-o", "d.html", cwd=tmp_path)
    assert status == 0, err
    assert "bad\\ud800name" in (tmp_path / "d.html").read_text(encoding="utf-8")


def test_run_verbs_print_live_tables_and_summaries_escaped(capsys):
    from opscope.cli.results import WindowWriter, print_summary, print_table

    class Profile:
        session = None

        def key_averages(self):
            class Rows:
                def table(self, **kwargs):
                    return "step\x1b[2J\ud800 1.0ms"
            return Rows()

    assert print_table(Profile(), sort="count", row_limit=5)
    writer = WindowWriter("/tmp", "out\x1b[31m", "train", by_step=False)
    writer.errors.append("cannot write trace 'x\x07'")
    print_summary(writer)
    out, err = capsys.readouterr()
    assert out == "step\\x1b[2J\\ud800 1.0ms\n"
    assert "\x07" not in err and "\\x07" in err


def test_bytes_that_are_not_utf8_inside_names_load_as_replacement_characters(tmp_path):
    # as torch 2.4 writes some python_function names with with_stack=True
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm\xd0\xff", '
                     b'"pid": 1, "tid": 1, "ts": 1, "dur": 5, "args": {}}]}')
    session = load_session(str(path))
    names = [session.table.symbols[int(i)] for i in session.table.name_id]
    assert names == ["aten::mm\ufffd\ufffd"]
