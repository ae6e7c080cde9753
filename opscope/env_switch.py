"""The environment's on/off switches (``OPSCOPE_ON_DEMAND``, ``OPSCOPE_BLACKBOX``), read alike.

``requested(name)`` is any value but off (``""``, 0, false, no, off): the
cheap check ``import opscope`` makes. ``switched_on(name)`` is 1, true, yes
or on; any other value that is not off is one warning line and counts as
off. ``in_multiprocessing_child()``: DataLoader workers and other
multiprocessing children inherit the variables but run no training steps.

Example::

    >>> requested("X", {"X": "0"}), requested("X", {"X": "maybe"}), switched_on("X", {"X": "On"})
    (False, True, True)
"""

from __future__ import annotations

import os
import warnings
from typing import Mapping, Optional

OFF = ("", "0", "false", "no", "off")
ON = ("1", "true", "yes", "on")


def _value(name: str, environ: Optional[Mapping[str, str]]) -> str:
    return (os.environ if environ is None else environ).get(name, "").strip().lower()


def requested(name: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``$name`` is set to anything but off."""
    return _value(name, environ) not in OFF


def switched_on(name: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``$name`` is on; a value neither on nor off warns in one line."""
    value = _value(name, environ)
    if value in OFF:
        return False
    if value not in ON:
        warnings.warn(f"{name}={value!r} not understood; expected 1 or 0", RuntimeWarning,
                      stacklevel=3)
        return False
    return True


def in_multiprocessing_child() -> bool:
    """True in a multiprocessing child (a spawned one imports the main module, and opscope,
    before ``parent_process()`` is set: ``_inheriting`` says so then)."""
    import multiprocessing

    return (multiprocessing.parent_process() is not None
            or getattr(multiprocessing.current_process(), "_inheriting", False))
