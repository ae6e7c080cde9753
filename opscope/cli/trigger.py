"""``opscope trigger PID [PID...] --steps N -o DIR``: profile a running process's next steps.

The process must have on-demand profiling enabled (``OPSCOPE_ON_DEMAND=1``,
``opscope.enable_on_demand()`` or ``python -m opscope.on_demand``). The
trigger leaves a request in the control folder, signals the process, waits
until the trace is written and prints its path. Several PIDs (one per
distributed rank, say) are triggered together. On a torch.distributed job
whose ranks all run with on-demand enabled, triggering ONE rank is enough:
every rank records the same future steps (the request travels through the
job's c10d store) and the answer lists every rank's trace, one per line.

Example::

    $ opscope trigger 4242 --steps 5 -o traces/
    traces/host_4242.1718000000000000000.pt.trace.json
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
import time
from typing import Dict, List, Tuple

from opscope.cli.errors import UsageError, print_error
from opscope.cli.options import add_output_dir, at_least_one, prepare_output_dir
from opscope.cli.profiling import add_profile_flags, profile_kwargs
from opscope.cli.terminal import write_text

SUMMARY = "profile the next optimizer steps of a running process (on-demand)"
DESCRIPTION = """\
Ask a running process that has on-demand profiling enabled (started with
OPSCOPE_ON_DEMAND=1, through 'python -m opscope.on_demand SCRIPT', or calling
opscope.enable_on_demand()) to profile its next N optimizer steps. The process
writes DIR/<host>_<pid>.<time_ns>.pt.trace.json and goes back to running
unprofiled; this command waits for the file and prints its path. The request
travels as a file in a private folder plus a signal; no network port is used.

On a torch.distributed job (every rank started with on-demand enabled, e.g.
'torchrun ... -m opscope.on_demand train.py'), give the PID of any one rank:
every rank records the same N future steps and writes
<host>_<pid>.rank<R>.<time_ns>.pt.trace.json into the job's own folder (the
OPSCOPE_ON_DEMAND_OUTPUT set at launch, else the -o of 'opscope run', else
./opscope-out where the rank runs; never DIR, for the request travels through
the job's store, which others may reach); this command prints every rank's
trace found there, and notes the others.

With --black-box, the process's black box (OPSCOPE_BLACKBOX=1, 'opscope run
--black-box', or opscope.blackbox()) writes its ring at once, without waiting
for steps, into its own folder; this command prints the file's path."""
DEFAULT_STEPS = 10
DEFAULT_TIMEOUT_S = 300.0
POLL_S = 0.05
MAX_RANKS_LISTED = 1 << 16


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


_POSITIVE_INT = at_least_one("an integer")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``trigger`` verb."""
    parser = subparsers.add_parser("trigger", help=SUMMARY, description=DESCRIPTION,
                                   usage="opscope trigger [options] PID [PID ...]",
                                   allow_abbrev=False)
    parser.add_argument("pids", metavar="PID", nargs="+", type=_POSITIVE_INT,
                        help="process id of the training process (several: each is triggered)")
    parser.add_argument("--steps", metavar="N", type=_POSITIVE_INT, default=DEFAULT_STEPS,
                        help=f"optimizer steps to profile (default: {DEFAULT_STEPS})")
    add_output_dir(parser, "the traces (written by the profiled process)")
    parser.add_argument("--timeout", metavar="SECONDS", type=_timeout, default=DEFAULT_TIMEOUT_S,
                        help=f"give up waiting for the trace after this long (default: "
                             f"{DEFAULT_TIMEOUT_S:g}); 0 sends the request and returns at once")
    parser.add_argument("--gzip", action="store_true", help="write the trace gzip-compressed")
    parser.add_argument("--black-box", action="store_true",
                        help="write the process's black box ring now (its last seconds) "
                             "instead of profiling steps")
    add_profile_flags(parser)
    parser.set_defaults(handler=main)


def _check_target(pid: int) -> int:
    """The signal ``pid`` listens on; UsageError when it cannot be triggered."""
    from opscope.on_demand import control

    if pid == os.getpid():
        raise UsageError(f"argument PID: {pid} is this trigger process itself")
    if not control.process_exists(pid):
        raise UsageError(f"argument PID: no process with id {pid}")
    try:
        registration = control.read_registration(pid)
    except OSError as exc:  # ControlFolderError: a symlink, not ours, not private
        raise UsageError(str(exc)) from None
    if registration is None:
        raise UsageError(f"argument PID: process {pid} is not enabled for on-demand profiling "
                         f"(start it with OPSCOPE_ON_DEMAND=1: a pip-installed opscope enables "
                         f"it when the program imports torch; or through "
                         f"'python -m opscope.on_demand SCRIPT', or call "
                         f"opscope.enable_on_demand() in it)")
    number = registration.get("signal")
    if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < 128:
        raise UsageError(f"argument PID: the on-demand registration of process {pid} is "
                         f"malformed (signal {number!r}); restart it with on-demand enabled")
    return number


def main(args: argparse.Namespace) -> int:
    """Send the requests, wait for the traces; 0 when every trace was written."""
    from opscope.on_demand import control

    targets = [(pid, _check_target(pid)) for pid in dict.fromkeys(args.pids)]
    folder = "." if args.black_box else prepare_output_dir(args.output_dir)
    sent: List[Tuple[int, str]] = []
    shared_id = None  # ranks of one job named together share the request: it is posted once
    for pid, signal_number in targets:
        request = control.new_request(args.steps, folder, options=profile_kwargs(args),
                                      gzip=args.gzip)
        if args.black_box:
            request["black_box"] = True  # the ring, now: no steps, no -o
        request["id"] = shared_id = shared_id or request["id"]
        try:
            control.write_request(pid, request)
        except OSError as exc:
            raise UsageError(f"cannot leave the request for process {pid} in the on-demand "
                             f"control folder: {exc}") from None
        try:
            os.kill(pid, signal_number)
        except OSError as exc:
            control.withdraw_request(pid, request["id"])
            raise UsageError(f"argument PID: cannot signal process {pid} "
                             f"({exc.strerror or exc})") from None
        sent.append((pid, request["id"]))
    if args.timeout == 0:
        for pid, _ in sent:
            print(f"opscope: requested {args.steps} steps from process {pid}", file=sys.stderr)
        return 0
    return _wait(sent, args.timeout, args.steps)


def _wait(sent: List[Tuple[int, str]], timeout: float, steps: int) -> int:
    from opscope.on_demand import control

    show_job = len(sent) == 1  # with several PIDs, each prints its own trace
    deadline = time.monotonic() + timeout
    waiting: Dict[int, str] = dict(sent)
    status = 0
    while waiting:
        for pid, request_id in list(waiting.items()):
            result = control.take_result(pid, request_id)
            if result is None and control.process_exists(pid):
                continue
            del waiting[pid]
            if result is None:
                result = control.take_result(pid, request_id)  # written just before exiting?
            status |= _report(pid, result, show_job)
        if waiting and time.monotonic() >= deadline:
            for pid, request_id in waiting.items():
                picked_up = not control.withdraw_request(pid, request_id)
                why = (f"it took the request but has not finished {steps} optimizer steps"
                       if picked_up else "it did not take the request (is it stuck outside "
                                         "Python code, or is its main thread blocked?)")
                print_error(f"process {pid}: no trace after {timeout:g} s: {why}")
            return 1
        if waiting:
            time.sleep(POLL_S)
    return status


def _report(pid: int, result, show_job: bool = True) -> int:
    """Print the trace's path; 1 with one line when there is no trace to show for it."""
    if result is None:
        print_error(f"process {pid} exited before writing a trace")
        return 1
    if result.get("status") != "ok":
        print_error(f"process {pid}: {result.get('message', 'unknown error')}")
        if show_job and isinstance(result.get("job"), dict):
            _report_job(pid, result["job"], "")
        return 1
    trace = result.get("trace")
    problem = _trace_problem(trace)
    if problem:
        print_error(f"process {pid} answered ok but its trace {trace!r} {problem}")
        return 1
    if result.get("note"):
        _warn(f"process {pid}: {result['note']}")
    if show_job and isinstance(result.get("job"), dict):
        return _report_job(pid, result["job"], trace)
    write_text(trace + "\n")
    return 0


def _warn(text: str) -> None:
    write_text(f"opscope: warning: {' '.join(str(text).split())}\n", sys.stderr)


def _report_job(pid: int, job: dict, own_trace: str) -> int:
    """Every rank's trace, one per line by rank; one warning line per rank without one.

    The answers of the other ranks came through the job's store, which others
    may have written: a trace is listed only when it is this job's
    (:func:`_job_trace_problem`), and every line is printed escaped.
    """
    ranks = job.get("ranks") if isinstance(job.get("ranks"), dict) else {}
    world = job.get("world_size") if isinstance(job.get("world_size"), int) else len(ranks)
    folder = job.get("folder") if isinstance(job.get("folder"), str) else ""
    printed = False
    for rank in range(min(max(world, 0), MAX_RANKS_LISTED)):
        answer = ranks.get(str(rank))
        if not isinstance(answer, dict):
            _warn(f"rank {rank} has not answered yet; look for its trace in {folder}")
            continue
        trace = answer.get("trace")
        if answer.get("status") != "ok":
            _warn(f"rank {rank}: {answer.get('message', 'no trace')}")
        elif _job_trace_problem(trace, folder, rank):
            _warn(f"rank {rank}: its answer names {trace!r}, which "
                  f"{_job_trace_problem(trace, folder, rank)}; not listed")
        else:
            write_text(trace + "\n")
            printed = printed or trace == own_trace
    if not printed and own_trace and not _trace_problem(own_trace):
        write_text(own_trace + "\n")  # the triggered rank's own, whatever the others said
    return 0


def _job_trace_problem(trace, folder: str, rank: int) -> str:
    """Why ``trace`` is not rank ``rank``'s trace in the job's ``folder`` ('' when it is).

    It must be a regular file (no symlink) of this user, directly in the
    folder, named as a rank's on-demand trace is: ``<host>_<pid>.rank<R>.<ns>.pt.trace.json``.
    """
    problem = _trace_problem(trace)
    if problem:
        return problem
    name = os.path.basename(trace)
    if not re.fullmatch(rf"[^/]*_[0-9]+\.rank{rank}\.[0-9]+\.pt\.trace\.json(\.gz)?", name):
        return f"is not named as rank {rank}'s trace"
    if not folder or os.path.realpath(os.path.dirname(trace)) != os.path.realpath(folder):
        return f"is not in the job's folder {folder!r}"
    if os.lstat(trace).st_uid != os.getuid():
        return "belongs to another user"
    return ""


def _trace_problem(trace) -> str:
    """Why ``trace`` is not a trace file ('' when it is one): missing, or not a regular file."""
    if not isinstance(trace, str) or not trace:
        return "is not a path"
    try:
        info = os.lstat(trace)
    except OSError as exc:
        return f"cannot be found ({exc.strerror or exc})"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    return ""
