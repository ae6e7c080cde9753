"""``opscope run`` in a torch.distributed job: the rank, the launch, and torchrun's SIGTERM.

Under torchrun every worker runs ``opscope run`` itself; ``worker_rank()``
reads its rank from torchrun's environment. ``opscope run --nproc-per-node N``
starts that job through torch's launcher (``torch.distributed.run --standalone``)
with the same options (``launch_command``), and returns its exit status. The
launcher runs through :mod:`opscope.cli.loopback_launcher`, so that the job's c10d
stores listen on 127.0.0.1 only (torchrun's own listen on every interface). When one rank fails,
torchrun stops the others with SIGTERM: ``SigtermExit`` turns that signal
into the script's exit, so the profiler stops and writes what it recorded.

Example::

    >>> worker_rank({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    1
    >>> worker_rank({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}) is None
    True
    >>> parse_nproc("4"), parse_nproc("auto")
    ('4', 'auto')
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, List, Mapping, Optional

from opscope.cli.errors import UsageError
from opscope.cli.profiling import PROFILE_FLAGS
from opscope.api.options import torchrun_env_info

TORCHRUN_MODULE = "torch.distributed.run"
LOOPBACK_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                 "loopback_launcher.py")
# runs a file as __main__ without importing opscope (``-c`` puts no package folder on sys.path)
RUN_FILE = ("import runpy, sys; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
NPROC_WORDS = ("auto", "cpu", "gpu")  # what torchrun accepts besides a count
SIGTERM_EXIT = 128 + signal.SIGTERM
INTERRUPT_GRACE_S = 60.0  # after Ctrl-C, how long torchrun may take to stop its workers


def worker_rank(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """This process's rank in a torchrun job of more than one rank; None otherwise."""
    info = torchrun_env_info(environ)
    if info is None or info["world_size"] < 2:
        return None
    return info["rank"]


def parse_nproc(text: str) -> str:
    """``--nproc-per-node``: a count >= 1, or torchrun's ``auto``, ``cpu`` or ``gpu``.

    >>> parse_nproc("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a number of processes >= 1, or auto, cpu or gpu; got '0'
    """
    if text in NPROC_WORDS or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(
        f"expected a number of processes >= 1, or auto, cpu or gpu; got {text!r}")


def run_options(args: argparse.Namespace) -> List[str]:
    """The ``opscope run`` options of ``args`` as command-line words, without the launch.

    >>> from opscope.cli.options import ScheduleSpec
    >>> words = run_options(argparse.Namespace(output_dir="out", schedule=ScheduleSpec(1, 1, 2),
    ...     sort="count", row_limit=5, report=True, with_stack=True))
    >>> words[:4]
    ['-o', 'out', '--schedule', '1,1,2,0']
    >>> words[4:]
    ['--sort', 'count', '--row-limit', '5', '--stack', '--report']
    """
    words = ["-o", args.output_dir]
    if args.schedule is not None:
        words += ["--schedule", ",".join(str(n) for n in args.schedule)]
    words += ["--sort", args.sort, "--row-limit", str(args.row_limit)]
    words += [flag for flag, (keyword, _) in PROFILE_FLAGS.items()
              if getattr(args, keyword, False)]
    if args.report:
        words.append("--report")
    if getattr(args, "hang_after", None) is not None:
        words += ["--hang-after", repr(args.hang_after)]
    if getattr(args, "black_box", False):
        words += ["--black-box", "--black-box-seconds", repr(args.black_box_seconds)]
    return words


def launch_command(args: argparse.Namespace) -> List[str]:
    """torch's launcher (stores on loopback) ``--standalone ... -m opscope run ...`` for ``args``."""
    return [sys.executable, "-c", RUN_FILE, LOOPBACK_LAUNCHER, "--standalone",
            "--local-addr", "127.0.0.1", "--nproc-per-node", args.nproc_per_node,
            "-m", "opscope", "run", *run_options(args), args.script, *args.script_args]


def check_not_a_worker() -> None:
    """Raise :class:`UsageError` when ``--nproc-per-node`` is given inside a torchrun job."""
    info = torchrun_env_info()
    if info is not None:
        raise UsageError(f"argument --nproc-per-node: this is already rank {info['rank']} of a "
                         f"torchrun job of {info['world_size']}; drop --nproc-per-node under "
                         f"torchrun")


def launch(cmd: List[str]) -> int:
    """Run torchrun as a child and return its exit status.

    A SIGTERM sent to us is passed on to it (it stops its workers, which write
    their traces). Ctrl-C reaches torchrun from the terminal too; we wait for
    it to stop its workers, at most ``INTERRUPT_GRACE_S``.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    proc = subprocess.Popen(cmd)
    previous = _forward_sigterm(proc)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            return proc.wait(timeout=INTERRUPT_GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            proc.wait()
            return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _forward_sigterm(proc: "subprocess.Popen[Any]") -> Any:
    """Pass SIGTERM on to ``proc``; the previous handler (None when not installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))


class SigtermExit:
    """Under ``opscope run``, a SIGTERM ends the script as ``sys.exit(143)`` would.

    Only while ``run(...)`` runs the script does the signal interrupt it;
    inside ``shielded(...)`` (the profiler's step) it waits until the step is
    done, and after the script it is only noted in ``received``, so the trace
    being written is never cut. ``install()``/``uninstall()`` set the handler
    and restore the previous one. Off the main thread it installs nothing,
    nor outside torchrun where SIGTERM is ignored (SIG_IGN: it ends nothing).

    >>> term = SigtermExit({})
    >>> term.install(); term.run(lambda: 7), term.received
    (7, False)
    >>> term.uninstall()
    """

    def __init__(self, environ: Optional[Mapping[str, str]] = None):
        self.active = threading.current_thread() is threading.main_thread() and (
            torchrun_env_info(environ) is not None
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN)
        self.received = False
        self._armed = False
        self._pending = False
        self._previous: Any = None

    def install(self) -> None:
        """Set our SIGTERM handler (where ``active``)."""
        if self.active:
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        """Put back the handler that was there before ``install()``."""
        if self.active and self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, _signum: int, _frame: Any) -> None:
        if self.received:
            return  # torchrun may signal again: the first one is being handled
        self.received = True
        if self._armed:
            self._armed = False
            raise SystemExit(SIGTERM_EXIT)
        self._pending = True

    def run(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` with a SIGTERM raising ``SystemExit(143)`` inside it."""
        self._armed = not self.received
        try:
            return func(*args)
        finally:
            self._armed = False

    def shielded(self, func: Callable[[], None]) -> None:
        """``func()`` uninterrupted; a SIGTERM received meanwhile exits after it."""
        armed, self._armed = self._armed, False
        try:
            func()
        finally:
            self._armed = armed
        if armed and self._pending:
            self._pending = False
            self._armed = False
            raise SystemExit(SIGTERM_EXIT)
