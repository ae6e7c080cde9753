"""Build and load the native observer (observer.cpp) against the installed torch.

The build is cached per torch version and source hash, in ``$OPSCOPE_CACHE_DIR``
or ``$XDG_CACHE_HOME/opscope`` (default ``~/.cache/opscope``).

Example::

    >>> from opscope.collect.native_build import load_native
    >>> ext = load_native()          # None when the build failed
    >>> ext is None or ext.RECORD_SIZE == 48
    True
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path
from typing import Any, Optional

SOURCE = Path(__file__).with_name("observer.cpp")
BUILD_FLAGS_TAG = b"-O2 -DNDEBUG"

_lock = threading.Lock()
_loaded: Optional[Any] = None
_failure: Optional[str] = None


def cache_dir() -> Path:
    """Folder that holds the compiled observers, one sub-folder per build."""
    explicit = os.environ.get("OPSCOPE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opscope"


def build_key() -> str:
    """Identifies one build: the torch version plus a hash of the source."""
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes() + BUILD_FLAGS_TAG).hexdigest()[:12]
    torch_tag = torch.__version__.replace("+", "_").replace(".", "_")
    return f"torch{torch_tag}_{digest}"


def failure_reason() -> Optional[str]:
    """Why the native observer is unavailable, or None when it loaded."""
    return _failure


def load_native() -> Optional[Any]:
    """Compile (first use only) and import the observer; None if that fails.

    A failure prints one line to stderr, once per process, and the caller falls
    back to the Python collector.
    """
    global _loaded, _failure
    with _lock:
        if _loaded is not None or _failure is not None:
            return _loaded
        try:
            _loaded = _build()
        except Exception as exc:  # any build or import error means: fall back
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            _failure = reason
            print(
                f"opscope: native collector unavailable ({reason}); "
                "using the Python fallback collector",
                file=sys.stderr,
            )
        return _loaded


def _build() -> Any:
    if os.environ.get("OPSCOPE_FORCE_BUILD_FAILURE"):
        raise RuntimeError("build disabled by OPSCOPE_FORCE_BUILD_FAILURE")
    import shutil

    if shutil.which("ninja") is None:
        try:
            import ninja  # noqa: F401  (pip's ninja puts the binary on PATH via its module)

            bin_dir = os.path.join(os.path.dirname(ninja.__file__), "data", "bin")
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            raise RuntimeError("ninja is not installed (pip install ninja)") from None
    from torch.utils import cpp_extension

    key = build_key()
    build_dir = cache_dir() / key
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=f"opscope_observer_{key.rsplit('_', 1)[-1]}",
        sources=[str(SOURCE)],
        build_directory=str(build_dir),
        extra_cflags=["-O2", "-DNDEBUG"],
        verbose=False,
    )
