"""``OPSCOPE_BLACKBOX=1 python train.py``: the black box for a script that never imports opscope.

The start-up hook (``_opscope_startup``) imports opscope once the program
has imported torch; that import calls :func:`start_from_environment`, which
starts a black box whose dumps go to ``$OPSCOPE_BLACKBOX_DIR`` (default
``./opscope-blackbox``) and that keeps ``$OPSCOPE_BLACKBOX_SECONDS`` (default
30). The process also answers ``opscope trigger PID --black-box`` (on-demand
listening is enabled beside it). It is skipped in multiprocessing children
(DataLoader workers). A problem is one warning line; the program goes on.

Example::

    >>> black_box_requested({"OPSCOPE_BLACKBOX": "1"}), black_box_requested({})
    (True, False)
"""

from __future__ import annotations

import atexit
import os
import warnings
from typing import Any, Mapping, Optional

from opscope.env_switch import in_multiprocessing_child, requested, switched_on

ENABLE_ENV = "OPSCOPE_BLACKBOX"
DIR_ENV = "OPSCOPE_BLACKBOX_DIR"
SECONDS_ENV = "OPSCOPE_BLACKBOX_SECONDS"
DEFAULT_DIR = "opscope-blackbox"


def black_box_requested(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``$OPSCOPE_BLACKBOX`` is set to anything but off."""
    return requested(ENABLE_ENV, environ)


def start_from_environment() -> Optional[Any]:
    """Start the black box the environment asks for; the black box, or None (with one
    warning line when it was asked for and could not start)."""
    import sys

    if (not switched_on(ENABLE_ENV) or _is_opscope_itself(sys.argv[0] if sys.argv else "")
            or in_multiprocessing_child()):
        return None
    try:
        from opscope.black_box.box import blackbox

        seconds = float(os.environ.get(SECONDS_ENV, "").strip() or 30)
        box = blackbox(dir=os.environ.get(DIR_ENV, "").strip() or DEFAULT_DIR, seconds=seconds)
        box.yields = True
        box.start()
        atexit.register(box.stop)
    except Exception as exc:  # noqa: BLE001 - never break the program's import
        warnings.warn(f"opscope: {ENABLE_ENV}: the black box is off: {exc}", RuntimeWarning)
        return None
    _listen_for_triggers()
    return box


def _is_opscope_itself(argv0: str) -> bool:
    """The opscope CLI (``opscope ...``, ``python -m opscope``): it runs no training; with
    ``opscope run``, the script's import of opscope has already happened here.

    >>> _is_opscope_itself("/usr/bin/opscope"), _is_opscope_itself("train.py")
    (True, False)
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return (os.path.basename(argv0) == "opscope"
            or os.path.abspath(argv0).startswith(package + os.sep))


def _listen_for_triggers() -> None:
    """So that ``opscope trigger PID --black-box`` reaches this process."""
    from opscope.on_demand import enable_on_demand, is_enabled

    if is_enabled():
        return
    try:
        enable_on_demand()
    except (RuntimeError, ValueError, OSError) as exc:
        warnings.warn(f"opscope: {ENABLE_ENV}: 'opscope trigger --black-box' cannot reach this "
                      f"process: {exc}", RuntimeWarning)
