"""The part of on-demand profiling that lives in the training process.

Idle, it costs nothing but a signal handler and the step tracker's optimizer
post-hook: no collector is loaded into the op path. When ``opscope trigger``
signals, the handler takes the request from the control folder and *arms*
the agent; at the next optimizer step it starts an ``opscope.profile``, lets
``steps`` more optimizer steps run, stops, and writes the Chrome trace (on a
background thread, so training goes on) as ``<host>_<pid>.<time_ns>.pt.trace.json``,
the name ``tensorboard_trace_handler`` gives. Then it answers the request
with the trace's path and is idle again.

On a job of several ranks the request goes to the whole job instead
(:mod:`opscope.on_demand.job`): ``job`` posts it, and every rank's agent is
armed for the same step range (``arm_job``); its trace is
``<host>_<pid>.rank<R>.<time_ns>.pt.trace.json``. Idle, ``on_step`` reads two
attributes.

Nothing of this runs while Python imports torch or exits: the job's thread starts when
this process is first seen to be a rank of a job of several ranks (``job_class``), and
the native collector is loaded (compiled, the first time) on a background thread from
the first optimizer step or trigger on (:meth:`OnDemandAgent.warm_up`). A request that
is not a job's waits for that load; a job's request begins at its step regardless.

Example::

    >>> agent = OnDemandAgent(pid=1)
    >>> agent.state
    'idle'
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional

from opscope.on_demand import control
from opscope.on_demand.window_limit import WindowLimit
from opscope.step_tracker import StepTracker


_JOB_FIELDS = ("first_step", "job", "rank", "origin")  # set by on_demand.job only


class _Window:
    """One request being served: the running profiler and the steps left."""

    def __init__(self, request: Dict[str, Any], profiler: Any, first_step: int,
                 metadata: Dict[str, Any]):
        self.request = request
        self.profiler = profiler
        self.first_step = first_step
        self.remaining = int(request["steps"])
        self.metadata = metadata  # the trace's "onDemand" entry
        self.limit = WindowLimit()  # it stops early past its time or byte limit

    def mark_partial(self, steps_recorded: int, why: str) -> None:
        """Mark the trace as cut short: ``"partial": true`` in its ``onDemand`` entry."""
        try:
            self.profiler.add_metadata_json("onDemand", json.dumps(
                {**self.metadata, "partial": True, "steps_recorded": steps_recorded,
                 "ended_by": why}))
        except Exception:  # noqa: BLE001  (the answer's note says it too)
            pass


class OnDemandAgent:
    """Serves trigger requests for process ``pid`` at optimizer-step boundaries."""

    def __init__(self, pid: int):
        self.pid = pid
        self._armed: List[Dict[str, Any]] = []  # requests waiting for the next step
        self._window: Optional[_Window] = None
        self._writers: List[threading.Thread] = []
        self.job: Any = None  # an on_demand.job.JobRequests, made by job_requests()
        self.job_class: Any = None  # JobRequests, set by enable_on_demand
        self._warm_up: Optional[threading.Thread] = None

    def job_requests(self) -> Any:
        """The job side of this agent, started once this process is a rank of a job; or None."""
        if self.job is None and self.job_class is not None and self.job_class.in_job():
            self.job = self.job_class(self)
        return self.job

    def warm_up(self) -> None:
        """Load the native collector on a background (daemon) thread, once; never waits."""
        if self._warm_up is None:
            self._warm_up = threading.Thread(target=_load_collector, daemon=True,
                                             name="opscope-collector-warm-up")
            self._warm_up.start()

    @property
    def collector_ready(self) -> bool:
        """True once :meth:`warm_up` has finished (loaded, or failed: the window reports it)."""
        return self._warm_up is not None and not self._warm_up.is_alive()

    @property
    def state(self) -> str:
        """``"idle"``, ``"armed"`` (waiting for a step) or ``"recording"``."""
        if self._window is not None:
            return "recording"
        return "armed" if self._armed else "idle"

    # -- entry points: signal handler, step listener, exit --------------------------------
    def on_signal(self, signum: int = 0, frame: Any = None) -> None:
        """Take this process's requests from the control folder and arm for the next step."""
        if os.getpid() != self.pid:  # a forked child inherited the handler: not its requests
            return
        try:
            requests = control.take_requests(self.pid)
        except OSError as exc:  # the folder is gone or no longer private: nothing to trust
            import warnings

            warnings.warn(f"opscope on-demand: a trigger signal was ignored: {exc}",
                          RuntimeWarning, stacklevel=2)
            return
        for request in requests:
            request = {k: v for k, v in request.items() if k not in _JOB_FIELDS}
            if request.get("black_box"):
                self._dump_black_box(request)
                continue
            self.warm_up()
            job = self.job_requests()
            if not _valid_request(request):
                self._answer(request, status="error",
                             message="malformed request (steps and output_dir are required)")
            elif job is not None and job.in_job():
                job.post(request)
            else:
                self.arm(request)

    def _dump_black_box(self, request: Dict[str, Any]) -> None:
        """``opscope trigger --black-box``: the running black box writes its ring now, and
        the answer is its file (or why there is none)."""
        from opscope.black_box.registry import active

        box = active()
        if box is None:
            self._answer(request, status="error", message=(
                "no black box runs in this process (start it with OPSCOPE_BLACKBOX=1, "
                "'opscope run --black-box', or opscope.blackbox())"))
            return

        def answer(path: Optional[str], why: str) -> None:
            if path is None:
                self._answer(request, status="error", message=f"black box dump {why}")
            else:
                self._answer(request, status="ok", trace=path)

        box.dump("trigger", on_done=answer)

    def arm(self, request: Dict[str, Any]) -> None:
        """Record from the next optimizer step on (unless busy: then answer so)."""
        if self._window is not None or self._armed:
            self._answer(request, status="error",
                         message="busy: this process is already serving a request; "
                                 "trigger again when it is done")
        else:
            self._armed.append(request)

    def arm_job(self, request: Dict[str, Any]) -> None:
        """Record steps ``first_step`` on of a job request (from the job thread).

        It replaces a job request still waiting for its first step: a request
        whose first step is far ahead never locks the newer ones out.
        """
        if StepTracker.current_step() >= request["first_step"]:
            self._answer(request, status="error", message=_too_late(
                request, StepTracker.current_step()))
            return
        if self._window is None and self._armed and self._armed[0].get("job"):
            self._answer(self._armed.pop(0), status="error", message=(
                f"replaced by a newer request ({request['id']}) before its first step"))
        self.arm(request)

    def on_step(self, step: int) -> None:
        """Called with the new global step after each optimizer step."""
        if self._warm_up is None:
            self.warm_up()
        job = self.job_requests()
        if job is not None and job.needs_store:  # once, when the process group exists
            job.open_store()
        window = self._window
        if window is not None:
            window.remaining -= 1
            cut = window.limit.exceeded() if window.remaining > 0 else ""
            if cut:  # marked partial in its trace; one line says why
                import warnings

                warnings.warn(f"opscope on-demand: the window {cut}", RuntimeWarning,
                              stacklevel=2)
                window.mark_partial(int(window.request["steps"]) - window.remaining, cut)
            if window.remaining <= 0 or cut:
                self._finish(window, step, note=cut or None)
            return
        if self._armed:
            first = self._armed[0].get("first_step")
            if first is None and not self.collector_ready:
                return  # a request of this process alone waits for the collector's load
            if first is None or step == first - 1:
                self._begin(self._armed.pop(0), step)
            elif step >= first:
                request = self._armed.pop(0)
                self._answer(request, status="error", message=_too_late(request, step))

    def on_exit(self, why: str = "the process exited") -> None:
        """At interpreter exit (or SIGTERM): write what was recorded, marked partial;
        answer what is still waiting."""
        window = self._window
        if window is not None:
            done = int(window.request["steps"]) - window.remaining
            window.mark_partial(done, why)
            self._finish(window, None, in_background=False,
                         note=f"{why} after {done} of {window.request['steps']} steps")
        for request in self._armed:
            self._answer(request, status="error",
                         message=f"{why} before its next optimizer step")
        self._armed = []
        for writer in self._writers:
            writer.join()
        if self.job is not None:
            self.job.close()

    # -- a window -------------------------------------------------------------------------
    def _begin(self, request: Dict[str, Any], step: int) -> None:
        from opscope.api.profiler import profile

        try:
            options = {k: bool(v) for k, v in request.get("options", {}).items()}
            prof = profile(**options)
            prof.start()
        except Exception as exc:  # noqa: BLE001  (answered to the trigger instead)
            self._answer(request, status="error", message=f"cannot start profiling: {exc}")
            return
        metadata = {"request": request["id"], "steps": int(request["steps"]),
                    "first_step": step + 1,
                    **({"origin_rank": request["origin"]} if request.get("job") else {})}
        try:
            prof.add_metadata_json("onDemand", json.dumps(metadata))
        except Exception:  # noqa: BLE001  (metadata is a nicety)
            pass
        self._window = _Window(request, prof, step + 1, metadata)

    def _finish(self, window: _Window, step: Optional[int], in_background: bool = True,
                note: Optional[str] = None) -> None:
        self._window = None
        try:
            window.profiler.stop()
            session = window.profiler.session
        except Exception as exc:  # noqa: BLE001
            self._answer(window.request, status="error", message=f"profiling failed: {exc}")
            return
        steps = int(window.request["steps"]) - max(window.remaining, 0)
        if in_background:
            writer = threading.Thread(target=self._write, name="opscope-on-demand-writer",
                                      args=(window, session, steps, note))
            self._writers = [w for w in self._writers if w.is_alive()] + [writer]
            writer.start()
        else:
            self._write(window, session, steps, note)

    def _write(self, window: _Window, session: Any, steps: int, note: Optional[str]) -> None:
        from opscope.outputs import FORMATS
        from opscope.handlers import HANDLER_FORMATS

        # the format and file name tensorboard_trace_handler gives
        format_name, suffix = HANDLER_FORMATS["tensorboard_trace_handler"]
        request = window.request
        try:
            folder = request["output_dir"]
            os.makedirs(folder, exist_ok=True)
            rank = f".rank{request['rank']}" if request.get("job") else ""
            name = f"{socket.gethostname()}_{self.pid}{rank}.{time.time_ns()}{suffix}"
            if request.get("gzip"):
                name += ".gz"
            path = FORMATS[format_name](session, os.path.join(folder, name))
        except Exception as exc:  # noqa: BLE001
            self._answer(request, status="error", message=f"cannot write the trace: {exc}")
            return
        fields: Dict[str, Any] = {"status": "ok", "trace": path, "steps": steps,
                                  "first_step": window.first_step}
        if note:
            fields["note"] = note
        self._answer(request, **fields)

    def _answer(self, request: Dict[str, Any], **fields: Any) -> None:
        if request.get("job") and self.job is not None:
            self.job.answer(request, fields)
            return
        try:
            control.write_result(self.pid, str(request.get("id", "unknown")), **fields)
        except (OSError, ValueError):
            pass  # the trigger reports the missing answer when it times out


def _load_collector() -> None:
    try:
        from opscope.collect import requested_collector

        if requested_collector() != "python":
            from opscope.collect.native.build import load_native

            load_native()
    except Exception:  # noqa: BLE001  (the window's profiler reports collector problems)
        pass


def _too_late(request: Dict[str, Any], step: int) -> str:
    return (f"too late: this rank saw the job's request at step {step}, after its first "
            f"step {request['first_step']} began; it recorded nothing")


def _valid_request(request: Dict[str, Any]) -> bool:
    steps = request.get("steps")
    return (isinstance(steps, int) and steps >= 1
            and isinstance(request.get("output_dir"), str) and bool(request["output_dir"]))
