"""On-demand profiling: profile a running training process from outside, when asked.

A process that calls ``opscope.enable_on_demand()`` (or imports opscope with
``OPSCOPE_ON_DEMAND=1`` set) runs with no profiling overhead. Then, from
another shell::

    opscope trigger PID --steps 5 -o traces/

profiles its next 5 optimizer steps, writes the Chrome trace into
``traces/`` and prints the file's path; the process goes back to running
unprofiled. The trigger is a signal (``SIGUSR2`` unless
``OPSCOPE_ON_DEMAND_SIGNAL`` names another) plus request files in a private
control folder (:mod:`opscope.on_demand.control`); no network port is opened.

On a torch.distributed job of several ranks, each rank started with
on-demand enabled, a trigger on any one rank makes every rank record the
same optimizer steps: the request travels through the job's own c10d store
(:mod:`opscope.on_demand.job`), and ``opscope trigger`` lists every rank's
trace.

A program that never imports opscope needs only the variable:
``OPSCOPE_ON_DEMAND=1 python train.py``. The start-up hook that pip installs
(``opscope-on-demand.pth``, ``_opscope_startup``) enables on-demand profiling
when the program has imported torch. Without the hook (opscope run from a
checkout), the launcher does it and runs the program as ``__main__``::

    python -m opscope.on_demand train.py --epochs 3

Example::

    >>> import opscope
    >>> opscope.enable_on_demand()
    >>> opscope.on_demand.is_enabled()
    True
    >>> opscope.disable_on_demand()
"""

from __future__ import annotations

import atexit
import os
import signal as signal_module
import threading
from typing import Any, Optional, Union

from opscope.env_switch import in_multiprocessing_child, requested, switched_on
from opscope.on_demand import control
from opscope.on_demand.agent import OnDemandAgent
from opscope.on_demand.job import JobRequests

ENABLE_ENV = "OPSCOPE_ON_DEMAND"
SIGNAL_ENV = "OPSCOPE_ON_DEMAND_SIGNAL"
DEFAULT_SIGNAL_NAME = "SIGUSR2"

_lock = threading.Lock()
_agent: Optional[OnDemandAgent] = None
_listener_id: Optional[int] = None
_previous_handler: Any = None
_signal_number: Optional[int] = None
_atexit_registered = False


def resolve_signal(value: Union[None, int, str] = None) -> int:
    """The signal number to listen on: ``value``, else ``$OPSCOPE_ON_DEMAND_SIGNAL``, else SIGUSR2.

    Accepts a number or a name with or without ``SIG`` (``"USR1"``).

    >>> resolve_signal("usr1") == signal_module.SIGUSR1
    True
    """
    if value is None:
        value = os.environ.get(SIGNAL_ENV, "").strip() or DEFAULT_SIGNAL_NAME
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        number = getattr(signal_module, name, None)
        if not isinstance(number, int) or name.startswith("SIG_"):
            raise ValueError(f"on-demand signal: unknown signal name {value!r}; "
                             f"expected e.g. SIGUSR2 or SIGUSR1")
        return int(number)
    number = int(value)
    if number in (int(signal_module.SIGKILL), int(signal_module.SIGSTOP)) or number <= 0:
        raise ValueError(f"on-demand signal: {number} cannot be caught; expected e.g. SIGUSR2")
    return number


def is_enabled() -> bool:
    """True while this process serves on-demand requests."""
    return _agent is not None


def enable_on_demand(signal: Union[None, int, str] = None) -> None:  # noqa: A002
    """Let ``opscope trigger <this pid>`` profile this process's next optimizer steps.

    Call it from the main thread (signal handlers live there). ``signal``
    picks the signal (default ``$OPSCOPE_ON_DEMAND_SIGNAL`` or SIGUSR2); one
    that already has a handler is refused, so nothing of the program's is
    replaced. Calling it again does nothing. Nothing is loaded or started
    now: the native collector loads (compiled on first use) on a background
    thread from the first optimizer step on, and the job's store thread starts
    once this process is a rank of a job of several ranks.
    """
    global _agent, _listener_id, _previous_handler, _signal_number, _atexit_registered
    number = resolve_signal(signal)
    import torch  # noqa: F401  (first, unlocked: its import runs opscope's after-torch hooks)

    with _lock:
        if _agent is not None and _agent.pid == os.getpid():
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("opscope.enable_on_demand() must be called from the main thread "
                               "(Python runs signal handlers there)")
        current = signal_module.getsignal(number)
        if current not in (signal_module.SIG_DFL, signal_module.SIG_IGN, None):
            name = signal_module.Signals(number).name
            raise RuntimeError(f"opscope.enable_on_demand: {name} already has a handler in this "
                               f"program; pick a free signal with {SIGNAL_ENV}=SIGUSR1 or "
                               f"enable_on_demand(signal=...)")
        from opscope.step_tracker import StepTracker, track_optimizer_steps

        agent = OnDemandAgent(os.getpid())
        control.register(agent.pid, number)
        agent.job_class = JobRequests
        _previous_handler = current
        signal_module.signal(number, agent.on_signal)
        track_optimizer_steps()
        _listener_id = StepTracker.add_listener(agent.on_step)
        _signal_number = number
        _agent = agent
        if signal_module.getsignal(signal_module.SIGTERM) is signal_module.SIG_DFL:
            signal_module.signal(signal_module.SIGTERM, _on_sigterm)
        if not _atexit_registered:
            atexit.register(_at_exit)
            register = getattr(threading, "_register_atexit", None)
            if register is not None:  # runs before Python waits for the threads
                register(_main_thread_done)
            _atexit_registered = True


def disable_on_demand() -> None:
    """Stop serving requests; a window being recorded is written first."""
    _disable("the process exited")


def _disable(why: str) -> None:
    global _agent, _listener_id, _signal_number
    with _lock:
        agent = _agent
        if agent is None:
            return
        _agent = None
        try:
            control.unregister(agent.pid)
        except OSError as exc:  # the folder was removed or replaced meanwhile; go on stopping
            import warnings

            warnings.warn(f"opscope on-demand: cannot withdraw the registration: {exc}",
                          RuntimeWarning, stacklevel=2)
        from opscope.step_tracker import StepTracker

        if _listener_id is not None:
            StepTracker.remove_listener(_listener_id)
            _listener_id = None
        if _signal_number is not None and agent.pid == os.getpid():
            signal_module.signal(_signal_number, _previous_handler or signal_module.SIG_DFL)
        _signal_number = None
        if signal_module.getsignal(signal_module.SIGTERM) is _on_sigterm:
            signal_module.signal(signal_module.SIGTERM, signal_module.SIG_DFL)
    agent.on_exit(why)


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM, where the program has no handler of its own: write, then end as SIGTERM does.

    The window being recorded is written, marked partial, and the trigger answered;
    then the signal's default action ends the process (killed by SIGTERM: status
    143 in a shell), atexit handlers not run, as without opscope. A second SIGTERM
    meanwhile ends it at once. A handler the program sets later replaces this one.
    """
    signal_module.signal(signum, signal_module.SIG_DFL)
    try:
        agent = _agent
        if agent is not None and agent.pid == os.getpid() and not _lock.locked():
            _disable("the process was stopped by SIGTERM")
    except Exception:  # noqa: BLE001  (the process ends as it would have, whatever happened)
        pass
    finally:
        os.kill(os.getpid(), signum)


def _forget_in_child() -> None:
    """After fork: the child is not the registered process; it serves nothing."""
    global _agent, _listener_id, _signal_number
    if _agent is None:
        return
    from opscope.step_tracker import StepTracker

    if _listener_id is not None:  # no lock: another thread may have held it at fork
        StepTracker._listeners.pop(_listener_id, None)
    _agent, _listener_id, _signal_number = None, None, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _main_thread_done() -> None:
    """The main thread has finished: the job's thread stops now, not at its next poll.

    Unless a thread of the program's own still runs (it may still train): then
    the job's thread stops by itself once that thread has ended.
    """
    agent = _agent
    job = agent.job if agent is not None and agent.pid == os.getpid() else None
    if job is None:
        return
    main = threading.main_thread()
    if not any(t.is_alive() and not t.daemon and t is not main
               and not t.name.startswith("opscope-") for t in threading.enumerate()):
        job.close(wait_s=0.0)


def _at_exit() -> None:
    """At exit, the window being recorded is written. A SIGTERM meanwhile (torchrun stopping
    the survivors of a dead rank) waits until it is, then ends the process as it would have."""
    if _agent is None or _agent.pid != os.getpid():
        return
    deferred: list = []
    try:
        previous = signal_module.signal(signal_module.SIGTERM, lambda *_: deferred.append(1))
    except (ValueError, OSError):  # not the main thread: nothing to defer
        previous = None
    try:
        disable_on_demand()
    finally:
        if previous is not None:
            signal_module.signal(signal_module.SIGTERM, signal_module.SIG_DFL
                                 if previous is _on_sigterm else previous)
        if deferred:
            os.kill(os.getpid(), signal_module.SIGTERM)


def on_demand_requested() -> bool:
    """True when ``$OPSCOPE_ON_DEMAND`` asks for on-demand profiling (any value but off).

    >>> import os
    >>> on_demand_requested() == (os.environ.get("OPSCOPE_ON_DEMAND", "").strip().lower()
    ...                           not in ("", "0", "false", "no", "off"))
    True
    """
    return requested(ENABLE_ENV)


def enable_from_environment() -> bool:
    """Enable on-demand profiling when ``$OPSCOPE_ON_DEMAND`` is 1/true/yes/on.

    ``import opscope`` calls this; so does the start-up hook, through that
    import, in a program that never imports opscope (``_opscope_startup``). It
    is skipped in multiprocessing children (DataLoader workers and the like),
    spawned ones included: they inherit the variable but run no training
    steps. Problems become a warning, so the import never fails.
    """
    if not switched_on(ENABLE_ENV) or in_multiprocessing_child():
        return False
    import warnings

    try:
        enable_on_demand()
    except (RuntimeError, ValueError, OSError) as exc:
        warnings.warn(f"{ENABLE_ENV}=1: on-demand profiling is not enabled: {exc}",
                      RuntimeWarning)
        return False
    return True


__all__ = ["enable_on_demand", "disable_on_demand", "is_enabled", "enable_from_environment",
           "resolve_signal"]
