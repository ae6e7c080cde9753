"""What a whole-job trigger request read from the c10d store may ask, and where ranks write.

The job's store has no authentication: whoever reaches the job's master port
can write the keys opscope reads. So a request read from the store is parsed
strictly and bounded (:func:`parse_job_request`), and it never chooses a path:
every rank writes into its job folder (:func:`job_folder`), the folder the job
was started with: ``$OPSCOPE_ON_DEMAND_OUTPUT`` set at launch, else the ``-o``
of ``opscope run`` in that rank, else ``./opscope-out`` of the rank's working
folder. A request may carry ``output_dir`` (older ranks posted one): it is
ignored.

Limits of a request from the store: 1 to :data:`MAX_STEPS` steps, a first step
at most :data:`MAX_AHEAD_STEPS` ahead of the reading rank, options among
:data:`OPTION_NAMES` with boolean values, at most :data:`MAX_REQUEST_BYTES` of
JSON. The window itself is bounded in time and memory too
(:mod:`opscope.on_demand.window_limit`).

Example::

    >>> parse_job_request('{"id": "abc123", "steps": 3, "first_step": 9, "origin": 1}',
    ...                   now_step=5, world_size=2)[0]["steps"]
    3
    >>> parse_job_request('{"id": "abc123", "steps": 3, "first_step": 9, "origin": 7}',
    ...                   now_step=5, world_size=2)[1]
    'origin is not a rank of this job'
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

from opscope.model.session import OPTION_NAMES
from opscope.on_demand import control

JOB_FOLDER_ENV = "OPSCOPE_ON_DEMAND_OUTPUT"
DEFAULT_JOB_FOLDER = "opscope-out"  # as opscope run's -o
MAX_STEPS = 1000
MAX_AHEAD_STEPS = 10_000  # a legitimate margin is a few seconds of steps
MAX_REQUEST_BYTES = 4096  # a request is about 200 bytes
MAX_TEXT = 4096  # an answer's trace path or message
_FIELDS = {"id", "steps", "first_step", "origin", "options", "gzip", "job", "output_dir",
           "created"}
_set_folder: Optional[str] = None


def set_job_folder(folder: str) -> None:
    """Make ``folder`` this rank's job folder (``opscope run -o``; the variable still wins)."""
    global _set_folder
    _set_folder = os.path.abspath(folder)


def job_folder() -> str:
    """The absolute folder this rank writes a job request's trace into (module docstring)."""
    chosen = os.environ.get(JOB_FOLDER_ENV, "").strip()
    if chosen:
        return os.path.abspath(chosen)
    return _set_folder or os.path.abspath(DEFAULT_JOB_FOLDER)


def _is_int(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _load(text: str) -> Tuple[Optional[Dict[str, Any]], str]:
    if len(text) > MAX_REQUEST_BYTES:
        return None, f"over {MAX_REQUEST_BYTES} bytes"
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None, "not JSON"
    if not isinstance(value, dict):
        return None, "not a JSON object"
    return value, ""


def check_job_request(request: Dict[str, Any], now_step: int, world_size: int) -> str:
    """Why ``request`` (from the store) is refused; '' when it is well formed and bounded."""
    unknown = set(request) - _FIELDS
    if unknown:
        return f"unknown fields {sorted(unknown)[:4]}"
    if not isinstance(request.get("id"), str) or not control.REQUEST_ID.fullmatch(request["id"]):
        return "no request id of 6 to 32 hex digits"
    if not _is_int(request.get("steps"), 1, MAX_STEPS):
        return f"steps is not 1 to {MAX_STEPS}"
    if not _is_int(request.get("first_step"), 1, now_step + MAX_AHEAD_STEPS):
        return f"first_step is not within {MAX_AHEAD_STEPS} steps ahead"
    if not _is_int(request.get("origin"), 0, world_size - 1):
        return "origin is not a rank of this job"
    options = request.get("options", {})
    if not isinstance(options, dict) or not set(options) <= set(OPTION_NAMES) or not all(
            type(v) is bool for v in options.values()):
        return f"options are not booleans among {', '.join(OPTION_NAMES)}"
    if type(request.get("gzip", False)) is not bool or request.get("job", True) is not True:
        return "gzip or job is not a boolean"
    return ""


def parse_job_request(text: str, now_step: int,
                      world_size: int) -> Tuple[Optional[Dict[str, Any]], str]:
    """``(request, '')`` for a request text from the store, else ``(None, why)``.

    The request is rebuilt from the checked fields only; it has no path.
    """
    value, why = _load(text)
    if value is None:
        return None, why
    why = check_job_request(value, now_step, world_size)
    if why:
        return None, why
    return {"id": value["id"], "steps": value["steps"], "first_step": value["first_step"],
            "origin": value["origin"], "options": dict(value.get("options", {})),
            "gzip": bool(value.get("gzip", False)), "job": True}, ""


def job_post(request: Dict[str, Any], first_step: int, origin: int) -> Dict[str, Any]:
    """What a rank posts for a trigger request it got: no path; options among the known."""
    options = request.get("options") if isinstance(request.get("options"), dict) else {}
    return {"id": request["id"], "steps": int(request["steps"]), "first_step": first_step,
            "origin": origin, "gzip": bool(request.get("gzip", False)), "job": True,
            "options": {k: bool(v) for k, v in options.items() if k in OPTION_NAMES}}


def parse_answer(text: str) -> Dict[str, Any]:
    """A rank's answer read from the store: known fields of the right types only."""
    value, _ = _load(text) if len(text) <= 4 * MAX_TEXT else (None, "")
    if value is None or value.get("status") not in ("ok", "error"):
        return {"status": "error", "message": "malformed answer in the job's store"}
    kept: Dict[str, Any] = {"status": value["status"]}
    for name in ("trace", "message", "note"):
        if isinstance(value.get(name), str):
            kept[name] = value[name][:MAX_TEXT]
    for name in ("steps", "first_step"):
        if type(value.get(name)) is int:
            kept[name] = value[name]
    return kept
