"""A Python that has imported torch once and forks a fresh child for each command.

``import torch`` costs a new process 2 to 4 s of CPU; a test that runs ``python -c CODE``
many times pays it each time. ``WarmPython`` starts one server process that imports the
modules it is given (torch; never opscope), then forks one child per ``run``: the child
takes the command's working folder, environment (``PYTHONPATH`` included) and standard
streams, runs ``-c CODE``, ``-m MODULE`` or a script as the interpreter would, and ends as
the interpreter does (SystemExit's rules, a traceback and status 1, non-daemon threads
joined, atexit handlers run, streams flushed). What happens at an interpreter's start-up
(``-X`` options, .pth files, ``PYTHON*`` variables other than ``PYTHONPATH``) is not
redone: commands that test those run a real interpreter.

    >>> with WarmPython(["json"]) as warm:
    ...     done = warm.run(["-c", "import sys; print(sys.argv[1:]); sys.exit(3)", "a"],
    ...                     timeout=60)
    >>> done.returncode, done.stdout
    (3, "['a']\\n")
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence

SERVER = r'''
import atexit, builtins, json, os, runpy, socket, sys, threading, types
from importlib.machinery import SourceFileLoader

channel = socket.socket(fileno=int(sys.argv[1]))
for name in sys.argv[2:]:
    __import__(name)
own_paths = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))
base_path = [p for p in sys.path[1:] if p not in own_paths]


def exit_status(exc):
    """Python's own rule for an uncaught SystemExit."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def child(request, fds):
    os.setsid()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    channel.close()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    status = 0
    try:
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[:] = ["", *extra, *base_path]
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[:] = [os.getcwd(), *extra, *base_path]
            runpy._run_module_as_main(argv[1])
        else:
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *extra, *base_path]
            path = os.path.abspath(argv[0])  # as the interpreter sets __file__
            with open(path, "rb") as source:
                code = compile(source.read(), path, "exec")
            main.__dict__.update(__file__=path, __cached__=None, __spec__=None,
                                 __loader__=SourceFileLoader("__main__", path))
            exec(code, main.__dict__)
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException:
        kind, value, tb = sys.exc_info()
        tb = tb.tb_next  # this function's frame
        sys.excepthook(kind, value.with_traceback(tb), tb)
        status = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    except SystemExit as exc:
        status = exit_status(exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = 120
    os._exit(status)


while True:
    message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 3)
    if not message:
        break
    request = json.loads(message)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(request, fds)
    for fd in fds:
        os.close(fd)
    channel.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    channel.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
'''


class WarmPython:
    """A server process that imported ``preload``; ``run`` forks a child of it per command.

    Runs one command at a time. ``close`` (or leaving the ``with`` block) ends the server."""

    def __init__(self, preload: Sequence[str] = ("torch",), python: str = sys.executable):
        ours, theirs = socket.socketpair()
        self._channel = ours
        self._received = b""
        self._server = subprocess.Popen(
            [python, "-c", SERVER, str(theirs.fileno()), *preload], pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self._lock = threading.Lock()

    def __enter__(self) -> "WarmPython":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()
        try:
            self._server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self._server.pid, signal.SIGKILL)
            self._server.wait()

    def run(self, argv: Sequence[str], *, timeout: float, env: Optional[dict] = None,
            cwd=None, text: bool = True) -> subprocess.CompletedProcess:
        """``python ARGV`` (``-c CODE ...``, ``-m MODULE ...`` or ``SCRIPT ...``) in a fork of
        the server, its output captured; on timeout its process group is killed and
        ``subprocess.TimeoutExpired`` raised."""
        request = {"argv": list(argv), "cwd": os.fspath(cwd or os.getcwd()),
                   "env": dict(os.environ if env is None else env)}
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        with self._lock:
            try:
                socket.send_fds(self._channel, [json.dumps(request).encode()],
                                [stdin, out_write, err_write])
            finally:
                for fd in (stdin, out_write, err_write):
                    os.close(fd)
            pid = self._reply("pid")
            reader = _Reader(out_read, err_read)
            deadline = time.monotonic() + timeout
            try:
                if not reader.join(timeout):
                    raise TimeoutError
                status = self._reply("status", deadline - time.monotonic())
            except TimeoutError:
                _kill_group(pid)
                self._reply("status")
                reader.join(None)
                raise subprocess.TimeoutExpired(["python", *argv], timeout) from None
        out, err = reader.output(text)
        return subprocess.CompletedProcess(["python", *argv], status, out, err)

    def _reply(self, key: str, timeout: Optional[float] = None):
        """The server's next line's ``key``; TimeoutError when none comes in ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._received:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._channel], [], [], wait)[0]:
                raise TimeoutError
            chunk = self._channel.recv(1 << 16)
            if not chunk:
                raise RuntimeError(f"the warm Python server ended ({self._server.poll()})")
            self._received += chunk
        line, self._received = self._received.split(b"\n", 1)
        return json.loads(line)[key]


class _Reader:
    """Reads a child's stdout and stderr to their ends, on two threads."""

    def __init__(self, *fds: int):
        self._chunks = {fd: [] for fd in fds}
        self._threads = [threading.Thread(target=self._read, args=(fd,), daemon=True)
                         for fd in fds]
        for thread in self._threads:
            thread.start()

    def _read(self, fd: int) -> None:
        with open(fd, "rb", closefd=True) as stream:
            for chunk in iter(lambda: stream.read1(1 << 16), b""):
                self._chunks[fd].append(chunk)

    def join(self, timeout: Optional[float]) -> bool:
        """Both streams read to their end within ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def output(self, text: bool):
        data = [b"".join(chunks) for chunks in self._chunks.values()]
        if not text:
            return data
        # as subprocess's text mode reads them: universal newlines
        return [d.decode().replace("\r\n", "\n").replace("\r", "\n") for d in data]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
