"""Build and load the native observer (observer.cpp) against the installed torch.

The build is cached per torch version and source hash, in ``$OPSCOPE_CACHE_DIR``
or ``$XDG_CACHE_HOME/opscope`` (default ``~/.cache/opscope``). Another C++
source (the execution-trace observer, et_observer.cpp) is built and cached the
same way through a ``NativeExtension``.

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
    return source_build_key(SOURCE)


def source_build_key(source: Path) -> str:
    """``build_key()`` for any C++ source: torch version plus that source's hash."""
    import torch

    digest = hashlib.sha256(source.read_bytes() + BUILD_FLAGS_TAG).hexdigest()[:12]
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


def _build(source: Path = SOURCE, module_prefix: str = "opscope_observer") -> Any:
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

    key = source_build_key(source)
    build_dir = cache_dir() / key
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=f"{module_prefix}_{key.rsplit('_', 1)[-1]}",
        sources=[str(source)],
        build_directory=str(build_dir),
        extra_cflags=["-O2", "-DNDEBUG"],
        verbose=False,
    )


class NativeExtension:
    """Another C++ source, built on first use and cached like observer.cpp.

    ``load()`` returns the module, or None when the build fails; the failure
    prints one line to stderr, once per process, ending with ``consequence``.

    >>> from pathlib import Path
    >>> ext = NativeExtension(Path("et_observer.cpp"), "opscope_et_observer",
    ...                       "execution trace observer", "it cannot record")
    >>> ext.failure_reason() is None
    True
    """

    def __init__(self, source: Path, module_prefix: str, what: str, consequence: str):
        self.source = Path(source)
        self.module_prefix = module_prefix
        self.what = what
        self.consequence = consequence
        self._lock = threading.Lock()
        self._loaded: Optional[Any] = None
        self._failure: Optional[str] = None

    def build_key(self) -> str:
        """The cache sub-folder of this source's build."""
        return source_build_key(self.source)

    def failure_reason(self) -> Optional[str]:
        """Why the extension is unavailable, or None (loaded, or not tried yet)."""
        return self._failure

    def load(self) -> Optional[Any]:
        """Compile (first use only) and import the extension; None if that fails."""
        with self._lock:
            if self._loaded is not None or self._failure is not None:
                return self._loaded
            try:
                self._loaded = _build(self.source, self.module_prefix)
            except Exception as exc:  # any build or import error: report, return None
                reason = " ".join(str(exc).split())[:300] or type(exc).__name__
                self._failure = reason
                print(f"opscope: {self.what} unavailable ({reason}); {self.consequence}",
                      file=sys.stderr)
            return self._loaded
