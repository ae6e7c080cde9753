"""with_stack's frame walk: one layout row per CPython, and a warning where none fits.

The walk (observer/frames.h, between the OPSCOPE-FRAME-WALK markers, with the
frames_cpython3XX.h it includes) is compiled here alone, with no torch, against
every CPython 3.10+ found (this one, and pyenv's), and its frames are compared with
what ``sys._getframe`` says. That checks 3.10, which
has no torch virtualenv here, as well as 3.11 to 3.13.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import opscope
from opscope.collect.native import collector as native
from opscope.collect.native.build import load_native
from subprocesses import run_in_group

HEADERS = Path(opscope.__file__).parent / "collect" / "native" / "observer"
FRAMES = HEADERS / "frames.h"  # the walk; each CPython's layout in frames_cpython3XX.h
KNOWN = {(3, 10), (3, 11), (3, 12), (3, 13)}

PROBE_MODULE = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cstdint>
#include <type_traits>
namespace {
%(walk)s

// The walk's frames as (filename, line, function), innermost first.
PyObject* stack(PyObject*, PyObject*) {
  FrameView views[128];
  int n = walk_frames(views, 128);
  PyObject* out = PyList_New(0);
  for (int i = 0; i < n && out != nullptr; ++i) {
    PyCodeObject* code = views[i].code;
    PyObject* row = Py_BuildValue("(OiO)", code->co_filename,
                                  PyCode_Addr2Line(code, views[i].lasti), code->co_name);
    if (row == nullptr || PyList_Append(out, row) < 0) Py_CLEAR(out);
    Py_XDECREF(row);
  }
  return out;
}
PyObject* known(PyObject*, PyObject*) { return PyBool_FromLong(kLayoutKnown); }
PyMethodDef methods[] = {{"stack", stack, METH_NOARGS, nullptr},
                         {"known", known, METH_NOARGS, nullptr},
                         {nullptr, nullptr, 0, nullptr}};
PyModuleDef module = {PyModuleDef_HEAD_INIT, "frame_walk_probe", nullptr, -1, methods};
}  // namespace
PyMODINIT_FUNC PyInit_frame_walk_probe() { return PyModule_Create(&module); }
"""

# Runs under the probed interpreter: calls the walk from plain functions, a method, a
# generator, a lambda called back from C (map: 3.12+ puts a C-stack shim frame there)
# and a comprehension, and prints each (walk, expected) pair.
PROBE_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import frame_walk_probe as probe

    def expected(frame):
        out = []
        while frame is not None:
            out.append([frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name])
            frame = frame.f_back
        return out

    def leaf():
        return probe.stack(), expected(sys._getframe())

    class Model:
        def forward(self):
            return leaf()

    def gen():
        yield leaf()

    def through_c():
        return list(map(lambda _: leaf(), [0]))[0]

    def comprehension():
        return [leaf() for _ in range(1)][0]

    results = [Model().forward(), next(gen()), through_c(), comprehension()]
    print(json.dumps({"known": probe.known(), "results": results}))
""")


def walk_source() -> str:
    text = FRAMES.read_text()
    match = re.search(r"// OPSCOPE-FRAME-WALK-BEGIN\n(.*?)// OPSCOPE-FRAME-WALK-END", text, re.S)
    assert match, "frames.h lost its OPSCOPE-FRAME-WALK markers"
    return match.group(1)


def interpreters():
    """This Python, and pyenv's 3.10 to 3.13 where installed."""
    found = {Path(sys.executable).resolve()}
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for folder in sorted(pyenv.glob("3.1[0-3]*")):
        exe = folder / "bin" / "python3"
        if exe.exists():
            found.add(exe.resolve())
    return sorted(found)


def python_config(python: Path) -> dict:
    code = ("import json, sys, sysconfig; print(json.dumps({'include': sysconfig.get_paths()"
            "['include'], 'suffix': sysconfig.get_config_var('EXT_SUFFIX'), "
            "'version': list(sys.version_info[:2]), "
            "'free_threaded': bool(sysconfig.get_config_var('Py_GIL_DISABLED'))}))")
    out = run_in_group([str(python), "-c", code], timeout=60)
    assert out.returncode == 0, out.stderr
    import json
    return json.loads(out.stdout)


@pytest.mark.parametrize("python", interpreters(), ids=lambda p: p.parent.parent.name)
def test_frame_walk_matches_the_interpreters_own_frames(python, tmp_path):
    import json
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the frame-walk probe")
    config = python_config(python)
    version = tuple(config["version"])
    if not Path(config["include"], "Python.h").exists():
        pytest.skip(f"no Python.h for {python}")
    source = tmp_path / "probe.cpp"
    source.write_text(PROBE_MODULE % {"walk": walk_source()})
    built = tmp_path / ("frame_walk_probe" + config["suffix"])
    compiled = run_in_group([compiler, "-std=c++17", "-O1", "-shared", "-fPIC",
                             "-I", config["include"], "-I", str(HEADERS), str(source),
                             "-o", str(built)],
                            timeout=300)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    script = tmp_path / "probe_script.py"
    script.write_text(PROBE_SCRIPT)
    ran = run_in_group([str(python), str(script), str(tmp_path)], timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads(ran.stdout)
    supported = version in KNOWN and not config["free_threaded"]
    assert report["known"] is supported
    for walked, expected in report["results"]:
        if not supported:
            assert walked == []
            continue
        # innermost first, same files, lines and functions as the interpreter's own view
        assert walked == expected
        assert walked[0][2] == "leaf"


def test_this_pythons_layout_is_known_to_the_observer(native_only):
    ext = load_native()
    if ext is None:
        pytest.skip("native observer unavailable")
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    assert ext.frame_walk_supported() is (sys.version_info[:2] in KNOWN and not free_threaded)


def count_ops(prof):
    return sum(1 for e in prof.events() if e.name.startswith("aten::"))


def test_unknown_layout_warns_once_in_one_line_and_still_profiles(native_only, monkeypatch):
    if load_native() is None:
        pytest.skip("native observer unavailable")
    monkeypatch.setenv("OPSCOPE_NO_FRAME_WALK", "1")
    monkeypatch.setattr(native, "_stack_warning_shown", False)
    x = torch.randn(8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with opscope.profile(with_stack=True) as prof:
                torch.mm(x, x).relu()
            assert prof.session.collector == "native"
            assert count_ops(prof) >= 2  # profiling goes on
            assert all(not e.stack for e in prof.events())
    shown = [w for w in caught if "stacks are off" in str(w.message)]
    assert len(shown) == 1
    message = str(shown[0].message)
    assert "\n" not in message and "with_stack" in message
    assert "OPSCOPE_NO_FRAME_WALK is set" in message


def test_the_warning_names_the_python_whose_layout_is_unknown(monkeypatch):
    monkeypatch.delenv("OPSCOPE_NO_FRAME_WALK", raising=False)
    message = native.stacks_off_message()
    assert f"Python {sys.version.split()[0]}" in message and "frame layout" in message
    assert "stacks are off" in message and "\n" not in message


def test_no_warning_without_with_stack_or_with_a_known_layout(native_only, monkeypatch):
    if load_native() is None:
        pytest.skip("native observer unavailable")
    monkeypatch.setattr(native, "_stack_warning_shown", False)
    x = torch.randn(8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setenv("OPSCOPE_NO_FRAME_WALK", "1")
        with opscope.profile():  # no with_stack: nothing to warn about
            torch.mm(x, x)
        monkeypatch.delenv("OPSCOPE_NO_FRAME_WALK")
        with opscope.profile(with_stack=True) as prof:
            torch.mm(x, x)
    assert not [w for w in caught if "stacks are off" in str(w.message)]
    if load_native().frame_walk_supported():
        mm = [e for e in prof.events() if e.name == "aten::mm"]
        assert mm and any("test_stack_layouts.py(" in f for f in mm[0].stack)
