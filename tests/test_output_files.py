"""Output files never replace a node that is not a regular file, and errors name the user's path.

Covers issue 13 (slice C): symlinks, FIFOs, character and block devices, a
full disk, a read-only file system, permission denied, the execution-trace
observer on a full disk, and bad paths rejected at the call. Tests that need
root (mount, chown, mknod, setuid) skip with the reason otherwise.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import select
import signal
import socket
import stat
import subprocess
import tempfile
import threading

import pytest

from opscope.autograd.legacy_export import write_legacy_stacks, write_legacy_trace
from opscope.execution_trace.writer import ExecutionTraceWriter
from opscope.files.atomic import atomic_text_writer
from opscope.export.chrome_trace import write_chrome_trace
from opscope.export.diff_html import write_diff_html
from opscope.export.memory_timeline import write_memory_timeline
from opscope.files.output_path import OutputFileError
from opscope.export.stacks import write_stacks
from opscope.handlers import report_handler, tensorboard_trace_handler
from opscope.report import write_report

from synthetic import Op, make_session

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (mount, chown, mknod, setuid)")


def big_session(n_ops: int = 3000):
    """A session whose Chrome trace is a few hundred KB: bigger than the tiny tmpfs."""
    return make_session([Op(f"aten::op_{i % 50}_with_a_long_name", i * 3, i * 3 + 2)
                         for i in range(n_ops)])


def small_session():
    return make_session([Op("aten::mm", 0, 5)])


def visible(folder) -> list:
    return sorted(os.listdir(folder))


def assert_names_path(exc: OSError, path: str, code: int) -> None:
    assert exc.errno == code
    assert exc.filename == path
    assert str(exc) == f"cannot write {path!r}: {os.strerror(code)}"
    assert ".tmp" not in str(exc)


@pytest.fixture
def tiny_tmpfs():
    """A 64 KiB tmpfs mounted on a fresh folder (root only); unmounted afterwards."""
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root")
    folder = tempfile.mkdtemp(prefix="opscope-tinyfs-")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs",
                             folder], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        os.rmdir(folder)
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", folder], capture_output=True, timeout=60)
        os.rmdir(folder)


# --- symlinks ------------------------------------------------------------------------------

def test_symlink_writes_its_target_atomically_and_stays_a_link(tmp_path):
    links, targets = tmp_path / "links", tmp_path / "targets"
    links.mkdir()
    targets.mkdir()
    target = targets / "real.json"
    target.write_text("old")
    os.chmod(target, 0o600)
    link = links / "trace.json"
    link.symlink_to(target)
    write_chrome_trace(small_session(), str(link))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["traceEvents"]
    assert visible(links) == ["trace.json"] and visible(targets) == ["real.json"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # a private file stays private


def test_relative_symlink_chain_is_followed_to_the_final_target(tmp_path):
    (tmp_path / "sub").mkdir()
    final = tmp_path / "sub" / "final.txt"
    final.write_text("old")
    (tmp_path / "sub" / "middle").symlink_to("final.txt")
    (tmp_path / "first").symlink_to("sub/middle")
    with atomic_text_writer(tmp_path / "first") as f:
        f.write("new")
    assert final.read_text() == "new"
    assert (tmp_path / "first").is_symlink() and (tmp_path / "sub" / "middle").is_symlink()
    assert visible(tmp_path / "sub") == ["final.txt", "middle"]


def test_dangling_symlink_creates_its_target(tmp_path):
    target = tmp_path / "made" / "new.txt"
    (tmp_path / "made").mkdir()
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with atomic_text_writer(link) as f:
        f.write("created")
    assert link.is_symlink() and target.read_text() == "created"


def test_dangling_symlink_into_a_missing_folder_names_the_link(tmp_path):
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "gone" / "new.txt")
    with pytest.raises(FileNotFoundError) as info:
        with atomic_text_writer(link) as f:
            f.write("never")
    assert info.value.filename == str(link) and "does not exist" in str(info.value)
    assert link.is_symlink() and visible(tmp_path) == ["link.txt"]


def test_symlink_loop_is_refused_with_eloop(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(OSError) as info:
        with atomic_text_writer(loop) as f:
            f.write("never")
    assert info.value.errno == errno.ELOOP and info.value.filename == str(loop)
    assert loop.is_symlink()


@needs_root
def test_another_users_symlink_in_a_sticky_shared_folder_is_not_followed(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = shared / "trace.json"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)  # planted by "nobody"
    with pytest.raises(PermissionError) as info:
        write_chrome_trace(small_session(), str(link))
    assert info.value.filename == str(link) and "another user's link" in str(info.value)
    assert victim.read_text() == "precious" and link.is_symlink()
    assert visible(shared) == ["trace.json"]


# --- FIFOs and devices ---------------------------------------------------------------------

def test_fifo_is_written_through_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_chrome_trace(small_session(), str(fifo))
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert json.loads(received[0])["traceEvents"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert visible(tmp_path) == ["trace.fifo"]


def test_fifo_without_a_reader_fails_instead_of_hanging(tmp_path):
    fifo = tmp_path / "nobody.fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as info:
        write_chrome_trace(small_session(), str(fifo))
    assert info.value.errno == errno.ENXIO and info.value.filename == str(fifo)
    assert "no process is reading" in str(info.value)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dev_null_stays_a_character_device():
    write_chrome_trace(big_session(), "/dev/null")
    with atomic_text_writer("/dev/null") as f:
        f.write("x" * 3_000_000)
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_dev_full_raises_enospc_naming_it_and_stays_a_device():
    with pytest.raises(OSError) as info:
        write_chrome_trace(small_session(), "/dev/full")
    assert_names_path(info.value, "/dev/full", errno.ENOSPC)
    assert isinstance(info.value, OutputFileError)
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


@needs_root
def test_block_device_is_refused_and_left_alone(tmp_path):
    node = tmp_path / "blk"
    os.mknod(node, 0o600 | stat.S_IFBLK, os.makedev(7, 0))
    with pytest.raises(OSError, match="block device") as info:
        write_chrome_trace(small_session(), str(node))
    assert info.value.filename == str(node)
    assert stat.S_ISBLK(os.lstat(node).st_mode) and visible(tmp_path) == ["blk"]


def test_socket_is_refused_and_left_alone(tmp_path):
    path = os.path.join(tempfile.mkdtemp(), "s")  # short: AF_UNIX paths are limited
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(path)
        with pytest.raises(OSError, match="socket") as info:
            write_stacks(small_session(), path)
        assert info.value.filename == path and stat.S_ISSOCK(os.lstat(path).st_mode)
    os.unlink(path)


# --- write errors name the user's path -----------------------------------------------------

def test_full_disk_names_the_path_and_keeps_the_previous_file(tiny_tmpfs):
    path = os.path.join(tiny_tmpfs, "trace.json")
    with open(path, "w") as f:
        f.write("previous")
    with pytest.raises(OSError) as info:
        write_chrome_trace(big_session(), path)
    assert_names_path(info.value, path, errno.ENOSPC)
    assert open(path).read() == "previous"
    assert visible(tiny_tmpfs) == ["trace.json"]


def test_full_disk_for_a_gzip_trace_cleans_up(tiny_tmpfs):
    path = os.path.join(tiny_tmpfs, "trace.json.gz")
    session = make_session([Op(f"op_{os.urandom(16).hex()}", i, i + 1) for i in range(6000)])
    with pytest.raises(OSError) as info:
        write_chrome_trace(session, path)
    assert_names_path(info.value, path, errno.ENOSPC)
    assert visible(tiny_tmpfs) == []


def test_read_only_file_system_names_the_path(tiny_tmpfs):
    subprocess.run(["mount", "-o", "remount,ro", tiny_tmpfs], check=True, timeout=60)
    path = os.path.join(tiny_tmpfs, "trace.json")
    with pytest.raises(OSError) as info:
        write_chrome_trace(small_session(), path)
    assert_names_path(info.value, path, errno.EROFS)


def _in_child_as_nobody(action) -> dict:
    """Run ``action()`` in a forked child with uid/gid 65534; its result as a dict."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            result = action()
        except BaseException as exc:  # report anything, never raise here
            result = {"unexpected": repr(exc)}
            code = 1
        os.write(write_end, json.dumps(result).encode())
        os._exit(code)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 120)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the child writing as uid 65534 hung")
        data = b""
        while chunk := os.read(read_end, 65536):
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def root_only_folder():
    """A root-owned 0755 folder that uid 65534 can reach but not write in."""
    folder = tempfile.mkdtemp(prefix="opscope-root-only-")
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def _export_as_nobody(path: str) -> dict:
    def export():
        try:
            write_chrome_trace(small_session(), path)
        except OSError as exc:
            return {"errno": exc.errno, "filename": exc.filename, "text": str(exc),
                    "permission": isinstance(exc, PermissionError)}
        return {"written": True}

    return _in_child_as_nobody(export)


@needs_root
def test_permission_denied_names_the_path(root_only_folder):
    path = os.path.join(root_only_folder, "trace.json")
    result = _export_as_nobody(path)
    assert result == {"errno": errno.EACCES, "filename": path, "permission": True,
                      "text": f"cannot write {path!r}: Permission denied"}
    assert visible(root_only_folder) == []


@needs_root
def test_permission_denied_on_an_existing_file_keeps_it(root_only_folder):
    path = os.path.join(root_only_folder, "trace.json")
    with open(path, "w") as f:
        f.write("previous")
    os.chmod(path, 0o666)  # writable, but the folder is not: no temp file can be made
    result = _export_as_nobody(path)
    assert (result["errno"], result["filename"]) == (errno.EACCES, path)
    assert open(path).read() == "previous" and visible(root_only_folder) == ["trace.json"]


@needs_root
def test_unreachable_folder_says_permission_denied_not_missing(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    path = str(private / "trace.json")
    result = _in_child_as_nobody(lambda: _error_text(path))
    assert result["permission"] and "Permission denied" in result["text"]
    assert "does not exist" not in result["text"]


def _error_text(path: str) -> dict:
    try:
        write_chrome_trace(small_session(), path)
    except OSError as exc:
        return {"text": str(exc), "permission": isinstance(exc, PermissionError)}
    return {"text": "", "permission": False}


def test_write_errors_pickle_with_their_class_and_text():
    with pytest.raises(OSError) as info:
        with atomic_text_writer("/dev/full") as f:
            f.write("x")
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.errno, again.filename, str(again)) == (info.value.errno, "/dev/full",
                                                         str(info.value))


def test_oserror_from_the_callers_own_code_is_not_relabelled(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        with atomic_text_writer(tmp_path / "out.txt") as f:
            f.write("x")
            open(tmp_path / "missing-input")
    assert not isinstance(info.value, OutputFileError)
    assert visible(tmp_path) == []


# --- the execution-trace observer ----------------------------------------------------------

def test_et_writer_on_a_full_device_raises_once_then_stays_quiet():
    writer = ExecutionTraceWriter("/dev/full")
    writer.write_nodes([])
    with pytest.raises(OSError) as info:
        writer.finish()
    assert_names_path(info.value, "/dev/full", errno.ENOSPC)
    assert writer.failed is info.value
    writer.write_nodes([])  # a cleanup after the error: nothing raised, nothing written
    writer.finish()
    writer.abandon()


def _run_ops(count: int) -> None:
    import torch

    x = torch.ones(2)
    for _ in range(count):
        x = x + 1


@pytest.mark.parametrize("ops", [200, 4000], ids=["fails-at-unregister", "fails-at-stop"])
def test_et_observer_on_a_full_disk(tiny_tmpfs, native_only, ops):
    import opscope

    path = os.path.join(tiny_tmpfs, "et.json")
    et = opscope.ExecutionTraceObserver().register_callback(path)
    errors = []
    try:
        et.start()
        _run_ops(ops)
        try:
            et.stop()
        except OSError as exc:
            errors.append(exc)
        try:
            et.unregister_callback()
        except OSError as exc:
            errors.append(exc)
    finally:
        if et.is_registered:
            et.unregister_callback()
    assert len(errors) == 1, errors  # raised once, from stop() or from unregister_callback()
    assert_names_path(errors[0], path, errno.ENOSPC)
    assert not et.is_registered
    et.cleanup()  # a second cleanup does not raise again
    assert visible(tiny_tmpfs) == []


def test_et_observer_read_only_file_system_fails_at_register(tiny_tmpfs, native_only):
    import opscope

    subprocess.run(["mount", "-o", "remount,ro", tiny_tmpfs], check=True, timeout=60)
    path = os.path.join(tiny_tmpfs, "et.json")
    et = opscope.ExecutionTraceObserver()
    with pytest.raises(OSError) as info:
        et.register_callback(path)
    assert_names_path(info.value, path, errno.EROFS)
    assert not et.is_registered


# --- bad paths fail at the call ------------------------------------------------------------

BAD_PATHS = [("", ValueError), (None, TypeError), (3, TypeError), (b"x.json", TypeError),
             ("a\0b", ValueError)]


def _writers():
    """(name shown in the error, call taking a path). ``None`` data proves no work is done first."""
    return [
        ("export_chrome_trace", lambda p: write_chrome_trace(None, p)),
        ("export_stacks", lambda p: write_stacks(None, p)),
        ("export_memory_timeline", lambda p: write_memory_timeline(None, p)),
        ("write_diff_html", lambda p: write_diff_html(None, p)),
        ("export_report", lambda p: write_report(None, p)),
        ("export_chrome_trace", lambda p: write_legacy_trace(None, p)),
        ("export_stacks", lambda p: write_legacy_stacks(None, p)),
        ("ExecutionTraceWriter", lambda p: ExecutionTraceWriter(p)),
    ]


@pytest.mark.parametrize("value,error", BAD_PATHS, ids=lambda v: repr(v))
@pytest.mark.parametrize("where,call", _writers(), ids=[w[0] + str(i) for i, w in
                                                       enumerate(_writers())])
def test_bad_path_fails_at_the_call_of_every_writer(where, call, value, error):
    with pytest.raises(error, match=rf"^{where}: path"):
        call(value)


@pytest.mark.parametrize("where,call", _writers(), ids=[w[0] + str(i) for i, w in
                                                       enumerate(_writers())])
def test_folder_or_missing_folder_fails_at_the_call_of_every_writer(where, call, tmp_path):
    with pytest.raises(IsADirectoryError, match=rf"^{where}: path .* is a folder"):
        call(tmp_path)
    with pytest.raises(IsADirectoryError, match="is a folder"):
        call(str(tmp_path / "new") + os.sep)
    with pytest.raises(FileNotFoundError, match=rf"^{where}: cannot write .*does not exist"):
        call(tmp_path / "no" / "such.json")
    assert visible(tmp_path) == []


@pytest.mark.parametrize("value,error", BAD_PATHS + [("folder", IsADirectoryError)],
                         ids=lambda v: repr(v))
def test_et_register_callback_checks_its_path(value, error, tmp_path):
    import opscope

    if value == "folder":
        value = tmp_path
    et = opscope.ExecutionTraceObserver()
    with pytest.raises(error, match="^ExecutionTraceObserver.register_callback: "
                                    "output_file_path"):
        et.register_callback(value)
    assert not et.is_registered


@pytest.mark.parametrize("make", [tensorboard_trace_handler, report_handler])
def test_handlers_check_dir_name_at_creation(make, tmp_path):
    where = make.__name__
    for value, error in BAD_PATHS:
        with pytest.raises(error, match=rf"^{where}: dir_name"):
            make(value)
    existing_file = tmp_path / "file"
    existing_file.write_text("x")
    with pytest.raises(NotADirectoryError, match=rf"^{where}: dir_name .* is not a folder"):
        make(existing_file)
    with pytest.raises(TypeError, match=rf"^{where}: worker_name"):
        make(tmp_path, worker_name=3)
    assert callable(make(tmp_path / "later"))  # a folder made on the first trace is fine
    assert not (tmp_path / "later").exists()


def test_tensorboard_handler_checks_use_gzip():
    with pytest.raises(TypeError, match="^tensorboard_trace_handler: use_gzip"):
        tensorboard_trace_handler("traces", use_gzip="yes")


def test_profile_exports_reject_bad_paths_at_the_call(tmp_path):
    import opscope

    with opscope.profile() as prof:
        _run_ops(3)
    for method in (prof.export_chrome_trace, prof.export_stacks, prof.export_report):
        for value, error in BAD_PATHS[:3]:
            with pytest.raises(error):
                method(value)
        with pytest.raises(IsADirectoryError):
            method(tmp_path)
    assert visible(tmp_path) == []


def test_replaced_file_keeps_its_mode_but_never_set_id_bits(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    os.chmod(path, 0o4750)
    with atomic_text_writer(path) as f:
        f.write("new")
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o750


@needs_root
def test_root_rewriting_a_users_file_keeps_its_owner(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    os.chown(path, 65534, 65534)
    with atomic_text_writer(path) as f:
        f.write("new")
    info = path.stat()
    assert (info.st_uid, info.st_gid) == (65534, 65534) and path.read_text() == "new"


def test_legacy_profile_exports_check_paths_and_name_dev_full(tmp_path):
    import warnings

    import opscope

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        prof = opscope.autograd.profile(with_stack=True)
    with prof:
        _run_ops(3)
    for method, where in ((prof.export_chrome_trace, "export_chrome_trace"),
                          (prof.export_stacks, "export_stacks")):
        for value, error in BAD_PATHS:
            with pytest.raises(error, match=rf"^{where}: path"):
                method(value)
        with pytest.raises(IsADirectoryError):
            method(tmp_path)
    with pytest.raises(OSError) as info:
        prof.export_chrome_trace("/dev/full")
    assert_names_path(info.value, "/dev/full", errno.ENOSPC)
    prof.export_chrome_trace(str(tmp_path / "ok.json"))  # what was recorded is kept
    assert json.loads((tmp_path / "ok.json").read_text())
    assert visible(tmp_path) == ["ok.json"]
