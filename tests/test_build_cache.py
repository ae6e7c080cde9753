"""The native build's cache under faults: killed builders, truncated or planted
libraries, foreign or writable folders, symlinks, read-only caches, two venvs.

Every run goes through a subprocess with a private OPSCOPE_CACHE_DIR. One real
compile, made just after a first builder was killed mid-compile, is shared by the
module (``built_cache``) and copied for each variant.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from opscope.collect.native import build_cache, build as native_build
from venvs import make_venv

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600

PROBE = textwrap.dedent("""
    import sys, torch, opscope
    from opscope.collect.native import build as native_build
    module = native_build.load_native()
    print("NATIVE", module is not None)
    if module is not None:
        with opscope.profile() as prof:
            torch.ones(3).add(1)
        print("ADD", any(e.name == "aten::add" for e in prof.events()))
    print("CPP_EXTENSION", "torch.utils.cpp_extension" in sys.modules)
""")


_warm = None


@pytest.fixture(scope="module", autouse=True)
def warm(warm_python):
    """``run`` forks the warm Python for this interpreter: the probes import torch, then
    opscope, whose cache handling is what they test; each fork imports opscope afresh."""
    global _warm
    _warm = warm_python
    yield
    _warm = None


def run(cache: Path, *, quiet: bool = True, code: str = PROBE, python: str = sys.executable,
        extra_env: dict = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh process on ``cache`` (a fork of the warm Python when
    ``python`` is this one); kill its whole group on timeout."""
    env = dict(os.environ)
    for name in ("OPSCOPE_COLLECTOR", "OPSCOPE_FORCE_BUILD_FAILURE", "OPSCOPE_QUIET_BUILD",
                 "OPSCOPE_BUILD_WAIT"):
        env.pop(name, None)
    if quiet:
        env["OPSCOPE_QUIET_BUILD"] = "1"
    env["OPSCOPE_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra_env or {})
    if python == sys.executable and _warm is not None:
        return _warm.run(["-c", code], env=env, timeout=timeout)
    proc = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def library(cache: Path) -> Path:
    """The observer's .so inside ``cache`` (same layout as library_path())."""
    key = native_build.build_key()
    return cache / key / f"opscope_observer_{key.rsplit('_', 1)[-1]}.so"


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def assert_fell_back(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 0, proc.stderr
    assert "NATIVE False" in proc.stdout
    line = one_line(proc)
    assert "native collector unavailable" in line and "Python fallback" in line
    for word in words:
        assert word in line, line


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """One real first build, not quiet, run after a first builder was killed mid-compile
    in the same cache: (cache folder, the build's process, what the kill left).

    The one compile serves the killed-builder test (the run after the kill must build
    and load) and every test below (a first build's lines, copies of its cache)."""
    cache = tmp_path_factory.mktemp("built") / "cache"
    killed = kill_a_first_build(cache, signal.SIGTERM)
    proc = run(cache, quiet=False)
    assert proc.returncode == 0, proc.stderr
    assert "NATIVE True" in proc.stdout, proc.stderr
    return cache, proc, killed


@pytest.fixture
def cache(built_cache, tmp_path):
    """A private copy of the built cache."""
    copy = tmp_path / "cache"
    shutil.copytree(built_cache[0], copy, symlinks=True)
    return copy


def needs_root():
    if os.geteuid() != 0:
        pytest.skip("needs root (chown to another user, mounts)")


# --- first build, cached runs -------------------------------------------------------------

def test_first_build_prints_where_then_how_long(built_cache):
    cache, proc, _ = built_cache
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert "compiling the native collector once (under a minute)" in lines[0]
    assert str(library(cache).parent) in lines[0]
    assert lines[1].startswith("opscope: built the native collector in ")
    assert not list(library(cache).parent.glob("build-*")), "the temp build folder was kept"
    assert (library(cache).stat().st_mode & 0o077) == 0


def test_cached_run_is_silent_and_skips_torchs_build_machinery(cache):
    so = library(cache)
    before = so.stat()
    proc = run(cache, quiet=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "NATIVE True" in proc.stdout and "ADD True" in proc.stdout
    assert "CPP_EXTENSION False" in proc.stdout
    after = so.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_build_key_has_python_abi_and_no_paths(tmp_path):
    key = native_build.build_key()
    assert sys.implementation.cache_tag in key
    assert os.sep not in key and str(Path.home()) not in key
    source = tmp_path / "a.cpp"
    source.write_text("int a;\n")
    first = native_build.source_build_key(source)
    source.write_text("int b;\n")
    assert native_build.source_build_key(source) != first


def test_two_venvs_share_one_build(cache, tmp_path):
    so = library(cache)
    before = so.stat()
    for name in ("venv-a", "venv-b"):
        make_venv(tmp_path / name)
    for name in ("venv-a", "venv-b", "venv-a", "venv-b"):
        proc = run(cache, quiet=False, python=str(tmp_path / name / "bin" / "python"))
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == "", f"{name} rebuilt or complained: {proc.stderr}"
        assert "NATIVE True" in proc.stdout
    after = so.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_nested_venv_imports_this_interpreters_packages(tmp_path):
    """The venvs above (and test_on_demand_startup's) see the packages the tests run with,
    also when the tests run in a virtualenv, where ``--system-site-packages`` would give
    the base interpreter's: no torch there, or another one, or another setuptools."""
    # Where each package is found, asked in a child: find_spec("pip") in this process
    # would switch off setuptools' distutils shim here (torch.compile then fails).
    code = ("import importlib.util, sys; print(sys.prefix)\n"
            "for n in ('torch', 'pip', 'setuptools'):\n"
            "    spec = importlib.util.find_spec(n); print(spec and spec.origin)")
    env = dict(os.environ, PYTHONPATH="")

    def where(python: str) -> list:
        done = subprocess.run([python, "-c", code], text=True, capture_output=True,
                              timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    venv = make_venv(tmp_path / "venv")
    here = where(sys.executable)
    assert here[1] != "None"  # torch
    assert where(str(venv / "bin" / "python")) == [str(venv), *here[1:]]


# --- damaged builds -------------------------------------------------------------------------

@pytest.mark.parametrize("keep", [0, 7, "half"])
def test_truncated_library_is_rebuilt_never_loaded(cache, keep):
    so = library(cache)
    data = so.read_bytes()
    so.write_bytes(data[: len(data) // 2 if keep == "half" else keep])
    # A forced build failure proves the run went to rebuild instead of loading (no SIGBUS).
    proc = run(cache, extra_env={"OPSCOPE_FORCE_BUILD_FAILURE": "1"})
    assert_fell_back(proc, "OPSCOPE_FORCE_BUILD_FAILURE")


def test_library_that_differs_from_its_stamp_is_not_loaded(cache):
    so = library(cache)
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    proc = run(cache, extra_env={"OPSCOPE_FORCE_BUILD_FAILURE": "1"})
    assert_fell_back(proc, "OPSCOPE_FORCE_BUILD_FAILURE")


def test_missing_stamp_means_rebuild(cache):
    build_cache.stamp_path(library(cache)).unlink()
    proc = run(cache, extra_env={"OPSCOPE_FORCE_BUILD_FAILURE": "1"})
    assert_fell_back(proc, "OPSCOPE_FORCE_BUILD_FAILURE")


# --- untrusted caches -----------------------------------------------------------------------

def test_foreign_owned_cache_folder_is_refused(cache):
    needs_root()
    os.chown(cache, 65534, 65534)
    proc = run(cache)
    assert_fell_back(proc, str(cache), "owned by uid 65534")


@pytest.mark.parametrize("which", ["library", "stamp", "folder"])
def test_foreign_owned_cache_entry_is_refused(cache, which):
    needs_root()
    so = library(cache)
    target = {"library": so, "stamp": build_cache.stamp_path(so), "folder": so.parent}[which]
    os.chown(target, 65534, 65534)
    proc = run(cache)
    assert_fell_back(proc, str(target), "owned by uid 65534")


@pytest.mark.parametrize("which", ["root", "folder", "library"])
def test_cache_writable_by_others_is_refused(cache, which):
    so = library(cache)
    target = {"root": cache, "folder": so.parent, "library": so}[which]
    os.chmod(target, os.stat(target).st_mode | (0o020 if which == "root" else 0o002))
    proc = run(cache)
    assert_fell_back(proc, str(target), "written by group or others")


@pytest.mark.parametrize("which", ["library", "stamp", "folder"])
def test_symlinked_cache_entry_is_refused(cache, tmp_path, which):
    so = library(cache)
    target = {"library": so, "stamp": build_cache.stamp_path(so), "folder": so.parent}[which]
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(target), str(elsewhere))
    os.symlink(elsewhere, target)
    proc = run(cache)
    assert_fell_back(proc, str(target), "symlink")


PLANTED_C = """
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    const char *marker = getenv("PLANTED_MARKER");
    if (marker) close(open(marker, O_CREAT | O_WRONLY, 0600));
}
"""


@pytest.mark.parametrize("foreign", [True, False])
def test_planted_library_never_runs(cache, tmp_path, foreign):
    """A .so another user planted, with a stamp that matches it, is refused before dlopen.

    ``foreign=False`` is the control: the same planted file owned by us is loaded,
    so its constructor leaves the marker (this is what the trust check prevents).
    """
    if foreign:
        needs_root()
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the planted library")
    source = tmp_path / "planted.c"
    source.write_text(PLANTED_C)
    planted = tmp_path / "planted.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(planted), str(source)], check=True,
                   timeout=120)
    so = library(cache)
    data = planted.read_bytes()
    so.write_bytes(data)
    build_cache.write_stamp(so, data)
    if foreign:
        os.chown(so, 65534, 65534)
        os.chown(build_cache.stamp_path(so), 65534, 65534)
    marker = tmp_path / "marker"
    proc = run(cache, extra_env={"PLANTED_MARKER": str(marker)})
    assert proc.returncode == 0, proc.stderr
    assert marker.exists() is not foreign
    if foreign:
        assert_fell_back(proc, "owned by uid 65534")


# --- read-only caches -----------------------------------------------------------------------

@pytest.fixture
def read_only(tmp_path):
    """Mount a folder read-only at a new path (root only); unmounted afterwards."""
    needs_root()
    mounts = []

    def mount(source: Path) -> Path:
        target = tmp_path / f"ro{len(mounts)}"
        target.mkdir()
        subprocess.run(["mount", "--bind", str(source), str(target)], check=True, timeout=30)
        mounts.append(target)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True, timeout=30)
        return target

    yield mount
    for target in reversed(mounts):
        subprocess.run(["umount", str(target)], timeout=30)


def test_read_only_cache_with_a_good_build_is_used(cache, read_only):
    (library(cache).parent / ".lock").unlink(missing_ok=True)
    mounted = read_only(cache)
    proc = run(mounted, quiet=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "NATIVE True" in proc.stdout


def test_read_only_cache_without_a_build_falls_back(tmp_path, read_only):
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    proc = run(read_only(empty), timeout=120)
    assert_fell_back(proc, "Read-only file system")


def test_full_disk_falls_back_with_one_line(tmp_path):
    """A cache on a full file system (a tmpfs with no inode left) cannot hold a build."""
    needs_root()
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=2,mode=0700", "tmpfs",
                    str(full)], check=True, timeout=30)
    try:
        (full / "cache").mkdir(mode=0o700)  # the last inode
        proc = run(full / "cache", timeout=120)
    finally:
        subprocess.run(["umount", str(full)], timeout=30)
    assert_fell_back(proc, "No space left on device", str(full / "cache"))


# --- concurrent and killed builders ---------------------------------------------------------

def test_live_builder_is_waited_on_then_the_run_falls_back(cache):
    so = library(cache)
    so.unlink()
    lock = os.open(so.parent / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = run(cache, extra_env={"OPSCOPE_BUILD_WAIT": "1"}, timeout=120)
    finally:
        os.close(lock)
    assert proc.returncode == 0, proc.stderr
    waiting, failed = proc.stderr.splitlines()
    assert "another process is building the native collector" in waiting
    assert "OPSCOPE_BUILD_WAIT" in waiting
    assert "kept building" in failed and "Python fallback" in failed
    assert "NATIVE False" in proc.stdout


def test_run_waits_for_a_live_builder_and_uses_its_build(cache, tmp_path):
    so = library(cache)
    stamp = build_cache.stamp_path(so)
    saved = tmp_path / "saved"
    saved.mkdir()
    shutil.move(str(so), str(saved / so.name))
    shutil.move(str(stamp), str(saved / stamp.name))
    lock = os.open(so.parent / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = dict(os.environ, OPSCOPE_CACHE_DIR=str(cache), OPSCOPE_BUILD_WAIT="120",
                   PYTHONPATH=str(REPO), OPSCOPE_QUIET_BUILD="1")
        waiter = subprocess.Popen([sys.executable, "-c", PROBE], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
        # readline() has no timeout: this kills the waiter if it never speaks.
        guard = threading.Timer(180, os.killpg, (waiter.pid, signal.SIGKILL))
        guard.start()
        try:
            waiting = waiter.stderr.readline()  # blocks until it waits on our lock
            assert "another process is building the native collector" in waiting
            shutil.move(str(saved / so.name), str(so))  # "our build" finishes
            shutil.move(str(saved / stamp.name), str(stamp))
            os.close(lock)
            lock = None
            out, err = waiter.communicate(timeout=120)
        except BaseException:
            os.killpg(waiter.pid, signal.SIGKILL)
            waiter.communicate()
            raise
        finally:
            guard.cancel()
    finally:
        if lock is not None:
            os.close(lock)
    assert waiter.returncode == 0, err
    assert err == ""
    assert "NATIVE True" in out and "ADD True" in out


def test_bad_build_wait_is_named(tmp_path):
    proc = run(tmp_path / "cache", extra_env={"OPSCOPE_BUILD_WAIT": "soon"}, timeout=120)
    assert_fell_back(proc, "OPSCOPE_BUILD_WAIT must be a number of seconds")


def build_workers(folder: Path) -> list:
    """Pids of build workers compiling into ``folder``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"build_worker.py") for arg in cmdline) and any(
                str(folder).encode() in arg for arg in cmdline):
            pids.append(int(entry.name))
    return pids


def kill_a_first_build(cache: Path, signal_to_parent: int) -> dict:
    """Start a first build in ``cache`` and send ``signal_to_parent`` to its process (the
    parent only, like `kill $!`) once the compiler runs; what was left, for the test."""
    folder = library(cache).parent
    env = dict(os.environ, OPSCOPE_CACHE_DIR=str(cache), OPSCOPE_QUIET_BUILD="1",
               PYTHONPATH=str(REPO))
    env.pop("OPSCOPE_FORCE_BUILD_FAILURE", None)
    victim = subprocess.Popen([sys.executable, "-c", PROBE], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    left = {}
    try:
        deadline = time.monotonic() + 300
        while not (folder.is_dir() and list(folder.glob("build-*/build.ninja"))):
            assert victim.poll() is None, "the first build ended before it could be killed"
            assert time.monotonic() < deadline, "the first build never started compiling"
            time.sleep(0.2)
        time.sleep(2)  # let the compiler get going
        left["workers_before"] = bool(build_workers(folder))
        victim.send_signal(signal_to_parent)
        victim.wait(timeout=60)
        deadline = time.monotonic() + 30
        while build_workers(folder) and time.monotonic() < deadline:
            time.sleep(0.2)
        left["workers_after"] = bool(build_workers(folder))
    finally:
        try:
            os.killpg(victim.pid, signal.SIGKILL)  # ninja and the compiler, orphaned
        except ProcessLookupError:
            pass
        victim.wait(timeout=60)
    left["library"] = library(cache).exists()
    return left


def test_killed_builder_does_not_block_the_next_run(built_cache):
    """Kill a first build mid-compile: its worker dies with it, and the next run
    builds and loads, never waiting on the dead builder (the issue's repro). The kill
    and the next run are ``built_cache``'s."""
    cache, proc, killed = built_cache
    assert killed["workers_before"], "no build worker found"
    assert not killed["workers_after"], "the build worker outlived its parent"
    assert not killed["library"]
    assert proc.returncode == 0, proc.stderr
    assert "another process is building" not in proc.stderr
    assert "compiling the native collector once" in proc.stderr  # it built, after the kill
    assert "NATIVE True" in proc.stdout and "ADD True" in proc.stdout
    assert not list(library(cache).parent.glob("build-*")), \
        "the killed build's temp folder was left behind"


FORK_WHILE_HOLDING = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from opscope.collect.native.build_cache import BuildLock
    lock = BuildLock(Path(sys.argv[1]))
    assert lock.acquire(0, lambda: None)
    child = os.fork()
    if child == 0:
        # off the test's pipes, or its subprocess.run would wait out this sleep
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    os._exit(0)  # the builder dies holding the lock; its forked child lives on
""")


def test_forked_child_does_not_keep_the_build_lock(tmp_path):
    folder = tmp_path / "key"
    folder.mkdir(mode=0o700)
    proc = subprocess.run([sys.executable, "-c", FORK_WHILE_HOLDING, str(folder)],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    child = int(proc.stdout.split()[0])
    try:
        os.kill(child, 0)  # still alive
        lock = build_cache.BuildLock(folder)
        assert lock.acquire(5, lambda: None), "the forked child kept the dead builder's lock"
        lock.release()
    finally:
        os.kill(child, signal.SIGKILL)


# --- failed builds --------------------------------------------------------------------------

BAD_EXTENSION = textwrap.dedent("""
    import sys
    from opscope.collect.native.build import NativeExtension
    ext = NativeExtension(sys.argv[1] if len(sys.argv) > 1 else {source!r}, "opscope_bad",
                          "bad extension", "it is skipped")
    print("LOADED", ext.load() is not None)
""")


def test_compiler_error_is_the_one_line_with_the_log_path(tmp_path):
    source = tmp_path / "broken.cpp"
    source.write_text("// first line\nint x = ;\n")
    proc = run(tmp_path / "cache", code=BAD_EXTENSION.format(source=str(source)), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED False" in proc.stdout
    line = one_line(proc)
    assert line.startswith("opscope: bad extension unavailable (broken.cpp:2: error: ")
    assert line.endswith("; it is skipped")
    log = Path(line.split("full log: ", 1)[1].split(")", 1)[0])
    assert log.is_file() and "error:" in log.read_text()
    assert "ninja" not in line and "c++ " not in line


def test_missing_compiler_is_named(tmp_path):
    """Checked before compiling: one line, no "compiling ... once" first (issue 27)."""
    proc = run(tmp_path / "cache", quiet=False, extra_env={"CXX": "/nonexistent/c++"},
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = one_line(proc)
    assert line == ("opscope: native collector unavailable (no C++ compiler: "
                    "'/nonexistent/c++' ($CXX) is not on PATH); using the Python fallback "
                    "collector")
    assert "NATIVE False" in proc.stdout


def test_build_worker_never_imports_opscope(tmp_path):
    """``import opscope`` acts on OPSCOPE_* variables (on-demand would build again)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", native_build._RUN_WORKER,
         str(native_build._WORKER), str(tmp_path / "missing.cpp"), str(tmp_path), "x",
         str(os.getpid())],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO), OPSCOPE_ON_DEMAND="1"))
    assert proc.returncode == 1
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    assert "torch" in imported
    assert not [name for name in imported if name.split(".")[0] == "opscope"]


def test_first_error_picks_the_compiler_line():
    log = ("W1124 some torch warning\n[1/2] c++ -c /a/b/observer.cpp -o observer.o\n"
           "FAILED: observer.o\n/a/b/observer.cpp:123:9: error: 'foo' was not declared\n"
           "ninja: build stopped: subcommand failed.\n")
    assert native_build.first_error(log) == "observer.cpp:123: error: 'foo' was not declared"
    assert native_build.first_error("") == "the build failed"
