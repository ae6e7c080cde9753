"""Build and load the native observer (observer.cpp and its headers) against torch.

The build is cached in ``$OPSCOPE_CACHE_DIR`` or ``$XDG_CACHE_HOME/opscope``
(default ``~/.cache/opscope``), one folder per ``build_key()``: the Python ABI,
the torch build, the platform, the flags, the source's and its headers' hash, and
no absolute path, so two virtualenvs over the same Python and torch share one build.

A cached build is checked against its stamp (``build_cache``) and imported
directly: no lock, no ninja, no compiler. Only a missing or stale build takes
the lock (``flock``, dropped by the OS when its holder dies) and compiles in a
child process (``build_worker``) into a private temp folder, then publishes the
``.so`` atomically. Another C++ source (et_observer.cpp) is built the same way
through a ``NativeExtension``.

A first build prints two lines on stderr (compiling, then how long it took)
unless ``OPSCOPE_QUIET_BUILD`` is set (the test suite sets it); a cached run
prints nothing. ``OPSCOPE_BUILD_WAIT`` bounds the wait for another live builder
(default 300 s), after which the run falls back. ``OPSCOPE_FORCE_BUILD_FAILURE``
makes any needed build fail, for tests.

Example::

    >>> from opscope.collect.native.build import load_native
    >>> ext = load_native()          # None when the build failed
    >>> ext is None or ext.RECORD_SIZE == 48
    True
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

from opscope.collect.native import build_cache
from opscope.collect.native.build_cache import BuildLock, StaleBuild
from opscope.collect.native.build_worker import FLAGS

SOURCE = Path(__file__).with_name("observer.cpp")
HEADERS = SOURCE.with_name("observer")  # observer.cpp's headers, one per job
BUILD_FLAGS_TAG = " ".join(FLAGS).encode()
WAIT_ENV = "OPSCOPE_BUILD_WAIT"
DEFAULT_WAIT_S = 300.0
# A compile that runs this long is stuck, not slow: kill it and fall back.
BUILD_TIMEOUT_S = 1800

_loaded: Optional[Any] = None   # read by tests/conftest.py
_failure: Optional[str] = None


class BuildFailed(RuntimeError):
    """The compile failed or could not start; the message is the one line to show."""


def cache_dir() -> Path:
    """Folder that holds the compiled observers, one sub-folder per build."""
    explicit = os.environ.get("OPSCOPE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opscope"


def build_key() -> str:
    """Identifies the observer's build (``source_build_key``, its headers' hash included)."""
    return OBSERVER.build_key()


def source_build_key(source: Path, extra_key: str = "", torch: bool = True) -> str:
    """``torch<version>_<python tag>_<hash>`` for a C++ source (``py_<python tag>_<hash>``
    for one built without torch: ``torch=False``).

    The hash covers what makes a built ``.so`` loadable: Python ABI, torch
    version and build, C++ ABI, platform, flags and the source; never a path.

    >>> source_build_key(SOURCE).startswith("torch")
    True
    """
    fields = {
        "layout": 2,
        "python": sys.implementation.cache_tag,
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "soabi": sysconfig.get_config_var("SOABI"),
        "platform": f"{sys.platform}-{platform.machine()}",
        "flags": BUILD_FLAGS_TAG.decode(),
        "source": hashlib.sha256(Path(source).read_bytes()).hexdigest(),
    }
    if torch:
        import torch as torch_module

        fields.update({
            "torch": torch_module.__version__,
            "torch_git": getattr(torch_module.version, "git_version", None),
            "cuda": getattr(torch_module.version, "cuda", None),
            "cxx11_abi": bool(getattr(torch_module._C, "_GLIBCXX_USE_CXX11_ABI", True))})
    if extra_key:  # what a source's own headers and flags add (never a path)
        fields["extra"] = extra_key
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    if not torch:
        return f"py_{sys.implementation.cache_tag}_{digest}"
    torch_tag = torch_module.__version__.replace("+", "_").replace(".", "_")
    return f"torch{torch_tag}_{sys.implementation.cache_tag}_{digest}"


class NativeExtension:
    """A C++ source built on first use, cached, and loaded from the cache after.

    ``load()`` returns the module, or None when it is unavailable; that prints
    one line to stderr, once per process, ending with ``consequence``.

    >>> from pathlib import Path
    >>> ext = NativeExtension(Path("et_observer.cpp"), "opscope_et_observer",
    ...                       "execution trace observer", "it cannot record")
    >>> ext.failure_reason() is None
    True
    """

    def __init__(self, source: Path, module_prefix: str, what: str, consequence: str,
                 extra: Optional[Any] = None, takes: str = "under a minute",
                 torch: bool = True):
        self.source = Path(source)
        # torch=False: a plain CPython extension (no torch headers or libraries), compiled
        # by the C++ compiler alone and loaded without importing torch
        self.torch = torch
        self.takes = takes  # what the first build's line says it takes
        # extra() -> {"include_dirs": [...], "cflags": [...], "key": str}, or raises
        # BuildFailed with the one line to show (the device collector's CUPTI)
        self.extra = extra
        self.module_prefix = module_prefix
        self.what = what
        self.consequence = consequence
        self._lock = threading.Lock()
        self._loaded: Optional[Any] = None
        self._failure: Optional[str] = None

    def build_key(self) -> str:
        """The cache sub-folder of this source's build."""
        return source_build_key(self.source, self.extra_options().get("key", ""), self.torch)

    def extra_options(self) -> dict:
        """The source's own include folders, flags, key part, ``plain`` (no torch); or {}."""
        options = dict(self.extra()) if self.extra is not None else {}
        if not self.torch:
            options["plain"] = True
        return options

    def library_path(self) -> Path:
        """Where the built ``.so`` lives in the cache (its stamp is beside it)."""
        key = self.build_key()
        return cache_dir() / key / f"{self.module_prefix}_{key.rsplit('_', 1)[-1]}.so"

    def failure_reason(self) -> Optional[str]:
        """Why the extension is unavailable, or None (loaded, or not tried yet)."""
        return self._failure

    def load(self) -> Optional[Any]:
        """Import the cached build, building it first when needed; None if that fails."""
        with self._lock:
            if self._loaded is not None or self._failure is not None:
                return self._loaded
            try:
                self._loaded = _load_or_build(self)
            except Exception as exc:  # any build, trust or import error: report, return None
                reason = " ".join(str(exc).split())[:1000] or type(exc).__name__
                self._failure = reason
                print(f"opscope: {self.what} unavailable ({reason}); {self.consequence}",
                      file=sys.stderr, flush=True)
            return self._loaded


OBSERVER = NativeExtension(SOURCE, "opscope_observer", "native collector",
                           "using the Python fallback collector",
                           extra=lambda: build_cache.headers_options(HEADERS))


def failure_reason() -> Optional[str]:
    """Why the native observer is unavailable, or None when it loaded."""
    return _failure


def load_native() -> Optional[Any]:
    """Import the observer (compiled on first use only); None if that fails.

    A failure prints one line to stderr, once per process: the Python collector takes over.
    """
    global _loaded, _failure
    module = OBSERVER.load()
    _loaded, _failure = module, OBSERVER.failure_reason()
    return module


def _load_or_build(ext: NativeExtension) -> Any:
    if ext.torch:
        import torch  # noqa: F401  (the extension links against torch's libraries)

    so = ext.library_path()
    folder, root = so.parent, so.parent.parent
    try:  # the common case: read-only checks, then import
        build_cache.trusted_root(root, create=False)
        build_cache.trusted_folder(folder, create=False)
        build_cache.verified_bytes(so)
        return _import(so)
    except StaleBuild:
        pass
    if os.environ.get("OPSCOPE_FORCE_BUILD_FAILURE"):
        raise BuildFailed("build disabled by OPSCOPE_FORCE_BUILD_FAILURE")
    build_cache.trusted_root(root, create=True)
    build_cache.trusted_folder(folder, create=True)
    wait_s = _wait_limit()
    lock = BuildLock(folder)

    def say_waiting() -> None:
        print(f"opscope: another process is building the {ext.what} in {folder}; "
              f"waiting up to {wait_s:.0f} s ({WAIT_ENV})", file=sys.stderr, flush=True)

    if not lock.acquire(wait_s, say_waiting):
        raise BuildFailed(f"another process kept building in {folder} for {wait_s:.0f} s "
                          f"(set {WAIT_ENV} to wait longer)")
    try:
        try:  # the process we waited for may have published it
            build_cache.verified_bytes(so)
        except StaleBuild:
            _compile(ext, so)
            build_cache.verified_bytes(so)
        return _import(so)
    finally:
        lock.release()


def _wait_limit() -> float:
    raw = os.environ.get(WAIT_ENV, "")
    if not raw:
        return DEFAULT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise BuildFailed(f"{WAIT_ENV} must be a number of seconds >= 0, got {raw!r}")
    return value


def _import(so: Path) -> Any:
    """Import a checked ``.so`` the way Python imports any extension module."""
    name = so.stem
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, str(so))
    spec = importlib.util.spec_from_file_location(name, str(so), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def _quiet() -> bool:
    return os.environ.get("OPSCOPE_QUIET_BUILD", "") not in ("", "0")


def _remove_leftovers(folder: Path) -> None:
    """Temp folders and partial files of builds that were killed (we hold the lock)."""
    for entry in os.scandir(folder):
        if entry.name.startswith("build-") and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        elif entry.name.endswith(".partial") and not entry.is_dir(follow_symlinks=False):
            try:
                os.unlink(entry.path)
            except OSError:
                pass


def _compile(ext: NativeExtension, so: Path) -> None:
    """Compile into a private temp folder in the cache, then publish the .so."""
    folder = so.parent
    _remove_leftovers(folder)
    log = folder / f"{so.stem}.build.log"
    env = _worker_env(ext.extra_options())  # the tools are checked before a word is said
    if not _quiet():
        print(f"opscope: compiling the {ext.what} once ({ext.takes}) into {folder}",
              file=sys.stderr, flush=True)
    started = time.monotonic()
    temp = tempfile.mkdtemp(prefix="build-", dir=folder)
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with os.fdopen(fd, "wb") as out:
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", _RUN_WORKER, str(_WORKER),
                     str(ext.source), temp, so.stem, str(os.getpid())],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=env, cwd=temp, timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise BuildFailed(f"the compile ran past {BUILD_TIMEOUT_S} s; "
                                  f"full log: {log}") from None
            except OSError as exc:
                raise BuildFailed(f"cannot start the build: {exc}") from None
        built = Path(temp) / f"{so.stem}.so"
        if proc.returncode != 0 or not built.is_file():
            text = log.read_text(errors="replace")
            raise BuildFailed(f"{first_error(text)}; full log: {log}")
        build_cache.publish(so, built.read_bytes())
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    if not _quiet():
        print(f"opscope: built the {ext.what} in {time.monotonic() - started:.0f} s",
              file=sys.stderr, flush=True)


# The worker runs by path, without importing opscope: ``import opscope`` acts on
# OPSCOPE_* variables (on-demand profiling would load, so build, the observer again).
_WORKER = Path(__file__).with_name("build_worker.py")
_RUN_WORKER = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def _worker_env(extra: Optional[dict] = None) -> dict:
    """The build's environment: ninja on PATH when pip installed it, no on-demand agent.

    Raises :class:`BuildFailed` naming every missing tool (the C++ compiler,
    ninja) in one line, before anything is compiled.
    """
    env = dict(os.environ)
    env.pop("OPSCOPE_BUILD_EXTRA", None)
    if extra:
        env["OPSCOPE_BUILD_EXTRA"] = json.dumps({k: extra[k] for k in ("include_dirs", "cflags",
                                                                      "plain") if k in extra})
    for name in ("OPSCOPE_ON_DEMAND", "OPSCOPE_BLACKBOX"):
        env.pop(name, None)  # the start-up hook would start one in the build
    missing = []
    compiler = missing_compiler(env)
    if compiler:
        missing.append(compiler)
    if not (extra or {}).get("plain") and shutil.which("ninja", path=env.get("PATH")) is None:
        try:
            import ninja  # pip's ninja keeps its binary inside the package

            bin_dir = os.path.join(os.path.dirname(ninja.__file__), "data", "bin")
            env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
        except ImportError:
            missing.append("ninja is not installed (pip install ninja)")
    if missing:
        raise BuildFailed("; ".join(missing))
    return env


def missing_compiler(env: dict) -> Optional[str]:
    """What is wrong with the C++ compiler torch's build would run ($CXX, else c++); None: found.

    >>> missing_compiler({"CXX": "no-such-compiler-x", "PATH": ""})
    "no C++ compiler: 'no-such-compiler-x' ($CXX) is not on PATH"
    """
    import shlex

    given = env.get("CXX", "").strip()
    try:
        program = (shlex.split(given) or [""])[0] if given else "c++"
    except ValueError:
        program = given
    if program and shutil.which(program, path=env.get("PATH")) is not None:
        return None
    if given:
        return f"no C++ compiler: {program!r} ($CXX) is not on PATH"
    return "no C++ compiler: 'c++' is not on PATH (install g++ or clang++, or set CXX)"


_COMPILER_ERROR = re.compile(
    r"^(?P<file>[^\s:]+):(?P<line>\d+):(?:\d+:)?\s*(?:fatal )?error:\s*(?P<msg>.*)$")
_OTHER_ERROR = re.compile(r"error|not found|no such file|cannot|permission denied", re.I)
_NOISE = ("FAILED:", "Traceback", "ninja: build stopped", "  File ")


def first_error(log_text: str) -> str:
    """The line of a build log that says what went wrong, shortened.

    >>> first_error("[1/2] c++ -c x.cpp\\n/src/observer.cpp:12:3: error: 'y' was not declared\\n")
    "observer.cpp:12: error: 'y' was not declared"
    """
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    for line in lines:
        match = _COMPILER_ERROR.match(line)
        if match:
            return (f"{os.path.basename(match['file'])}:{match['line']}: error: "
                    f"{match['msg']}")[:300]
    for line in lines:
        if _OTHER_ERROR.search(line) and not line.startswith(_NOISE):
            return line[:300]
    return (lines[-1] if lines else "the build failed")[:300]
