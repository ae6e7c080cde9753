"""``opscope run [options] script.py [args...]``: profile a Python program.

The script runs as ``__main__`` with its own arguments. Every
``optimizer.step()`` ends a step of the profiler, so ``--schedule`` counts
training iterations. Afterwards the table of the last recorded window is
printed and its trace written to the output folder.

In a torch.distributed job (``torchrun ... -m opscope run``, or
``opscope run --nproc-per-node N``, which launches it through
``torch.distributed.run``) every rank profiles itself: its files are named
``<script>.rank<R>...``, only rank 0 prints the table, and a rank that
torchrun stops (SIGTERM) still writes what it recorded.

Example::

    $ opscope run -o out --schedule 1,1,3 train.py --epochs 1
    $ opscope run --nproc-per-node 2 -o out train.py   # out/train.rank0.pt.trace.json, ...
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Optional


import opscope
from opscope.cli.black_box_run import add_black_box_options, run_with_black_box
from opscope.cli.errors import UsageError
from opscope.cli.hang_option import StepGuard, add_hang_option, start_hang_watch
from opscope.cli.options import (SCHEDULE_FORM, add_output_dir, add_table_options,
                                 parse_schedule, prepare_output_dir)
from opscope.cli.profiling import (add_profile_flags, make_schedule, profile_kwargs,
                                   start_profiler, warm_up_collector)
from opscope.cli.terminal import silence_closed_streams
from opscope.cli.results import OUTPUTS, REPORT, WindowWriter, print_summary, print_table
from opscope.cli.torchrun import (SIGTERM_EXIT, SigtermExit, check_not_a_worker, launch,
                                  launch_command, parse_nproc, worker_rank)
from opscope.on_demand.job_request import set_job_folder
from opscope.script import run_script, syntax_error

if TYPE_CHECKING:
    from opscope.api.session_profile import SessionProfile

STOOD_DOWN = ("the script starts its own opscope.profile: opscope run's profiler stops "
              "here and writes nothing more; the script's profiler records as written")
SUMMARY = "profile a Python script (each optimizer.step() ends a profiler step)"
DESCRIPTION = """\
Run SCRIPT as __main__ under opscope.profile, print the key_averages table of
the last recorded window and write its Chrome trace to DIR/<script>.pt.trace.json.
With --schedule, every optimizer.step() call advances the schedule and each
active window is written as DIR/<script>.step<N>.pt.trace.json (N: the
window's last step). Everything after SCRIPT is passed to it untouched, and
opscope exits with the script's exit status (1 if it raised).

In a torch.distributed job, every rank profiles itself and its files are named
DIR/<script>.rank<R>.pt.trace.json, or DIR/<script>.rank<R>.step<N>.pt.trace.json
with --schedule (the report likewise); only rank 0 prints the table. Start the
job with 'torchrun --nproc-per-node N -m opscope run [options] SCRIPT', or with
'opscope run --nproc-per-node N [options] SCRIPT', which runs torchrun
(python -m torch.distributed.run --standalone) and exits with its status.
Analyse the ranks' traces together with 'opscope ranks DIR'."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``run`` verb."""
    parser = subparsers.add_parser("run", help=SUMMARY, description=DESCRIPTION,
                                   usage="opscope run [options] SCRIPT [ARGS...]",
                                   allow_abbrev=False)
    add_output_dir(parser, "the traces")
    parser.add_argument(
        "--schedule", metavar=SCHEDULE_FORM, type=parse_schedule,
        help="record in cycles counted in optimizer steps, as opscope.schedule(wait=, "
             "warmup=, active=, repeat=); REPEAT 0 (default) cycles until the end")
    add_table_options(parser)
    add_profile_flags(parser)
    parser.add_argument(
        "--report", action="store_true",
        help="also write the HTML report of each recorded window, beside its trace and "
             "named like it (DIR/<script>.html; DIR/<script>.step<N>.html with --schedule)")
    parser.add_argument(
        "--nproc-per-node", metavar="N", type=parse_nproc, default=None,
        help="run SCRIPT on N ranks on this host through torchrun "
             "(python -m torch.distributed.run --standalone), each rank profiled")
    add_hang_option(parser)
    add_black_box_options(parser)
    # optional for argparse only, so a missing SCRIPT gets our message, not "SCRIPT, ARGS"
    parser.add_argument("script", metavar="SCRIPT", nargs="?", help="the Python file to run")
    parser.add_argument("script_args", metavar="ARGS", nargs=argparse.REMAINDER,
                        help="arguments for the script, passed through untouched")
    parser.set_defaults(handler=main)


def check_script(path: Optional[str]) -> None:
    """Raise :class:`UsageError` unless ``path`` is a file to run."""
    if not path:
        raise UsageError("argument SCRIPT: expected the Python file to run, "
                         "as in: opscope run [options] script.py [args...]")
    if os.path.isdir(path):
        raise UsageError(f"argument SCRIPT: {path!r} is a folder; expected a Python file")
    if not os.path.isfile(path):
        raise UsageError(f"argument SCRIPT: script {path!r} not found")


def check_report_available() -> None:
    """Raise :class:`UsageError` when the HTML report cannot be written here."""
    try:
        from opscope.report import write_report  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"argument --report: the HTML report is unavailable "
                         f"(opscope.report cannot be imported: {exc})") from None


def main(args: argparse.Namespace) -> int:
    """Profile the script; return the exit status ``opscope run`` ends with."""
    check_script(args.script)
    error = syntax_error(args.script)
    if error is not None:  # nothing to profile: say why, as python would, and write nothing
        print(error, file=sys.stderr)
        return 1
    if args.report:
        check_report_available()
    if args.nproc_per_node is not None:
        check_not_a_worker()
        prepare_output_dir(args.output_dir)
        print(f"opscope: launching {args.nproc_per_node} ranks through torchrun",
              file=sys.stderr)
        return launch(launch_command(args))
    if args.black_box:
        return run_with_black_box(args, prepare_output_dir(args.output_dir))
    return profile_script(args)


def profile_script(args: argparse.Namespace) -> int:
    """Run the script in this process under the profiler; its exit status."""
    folder = prepare_output_dir(args.output_dir)  # a bad -o is one line before torch loads
    from opscope.cli.step_hook import after_optimizer_steps

    set_job_folder(folder)  # where an on-demand job trigger writes (never where the store says)
    rank = worker_rank()
    who = "opscope: " if rank is None else f"opscope: rank {rank}: "
    stem = os.path.splitext(os.path.basename(args.script))[0]
    if rank is not None:
        stem += f".rank{rank}"
    outputs = OUTPUTS + [REPORT] if args.report else OUTPUTS
    writer = WindowWriter(folder, args.output_dir, stem, by_step=args.schedule is not None,
                          outputs=outputs)
    prof = opscope.profile(schedule=make_schedule(args.schedule), on_trace_ready=writer,
                           **profile_kwargs(args))
    prof._yield_note = lambda: print(f"{who}{STOOD_DOWN}", file=sys.stderr, flush=True)
    prof._warn_new_cycle = False  # each window is written and kept here: nothing is lost
    warm_up_collector()
    guard = StepGuard()  # the step, and a write at a reported hang, take turns
    watch = start_hang_watch(args, folder, rank, who, prof, writer, guard)
    sigterm = SigtermExit()
    sigterm.install()
    try:
        with after_optimizer_steps(lambda: guard.run(lambda: sigterm.shielded(prof.step))):
            start_profiler(prof)
            try:
                outcome = sigterm.run(run_script, args.script, args.script_args)
            finally:
                if watch is not None:
                    watch.close()
                guard.run(lambda: _stop(prof, writer))
    finally:
        sigterm.uninstall()
    if sigterm.received:
        print(f"{who}stopped by SIGTERM; what was recorded until then is kept",
              file=sys.stderr)
    if prof.stood_down:  # the script profiled itself: its profiler's output is the output
        if writer.written or writer.errors:
            print_summary(writer, who)
    else:
        if rank in (None, 0) and not _print_table(writer.shown_window(), args):
            print(who + _nothing_recorded(args, prof.step_num), file=sys.stderr)
        print_summary(writer, who)
    outcome.report()
    if outcome.exit_code == 0 and (writer.errors or sigterm.received):
        return SIGTERM_EXIT if sigterm.received else 1
    return outcome.exit_code


def _stop(prof: "opscope.profile", writer: WindowWriter) -> None:
    writer.stopping = True
    prof.stop()


def _print_table(window: "Optional[SessionProfile]", args: argparse.Namespace) -> bool:
    """``print_table`` of the window shown (the last complete one, else the partial one).

    A closed stdout (``| head``) ends the table, not the exit status.
    """
    if window is None:
        return False
    try:
        sys.stdout.flush()
        return print_table(window, sort=args.sort, row_limit=args.row_limit,
                           label=window.label)
    except BrokenPipeError:
        silence_closed_streams()
        return True


def _nothing_recorded(args: argparse.Namespace, steps: int) -> str:
    spec = args.schedule
    if spec is None:
        return "nothing was recorded"
    return (f"nothing was recorded: --schedule waits {spec.wait} and warms up "
            f"{spec.warmup} optimizer steps before recording, and the script made {steps}")
