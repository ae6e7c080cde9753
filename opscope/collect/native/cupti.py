"""The device collector: CUPTI activity records for ``ProfilerActivity.CUDA``.

``CuptiProbe`` is one probe of a ``Recording``: ``start()`` enables CUPTI's
activity kinds (concurrent kernels, memcpy, memset, runtime and driver API),
``stop()`` flushes what CUPTI still holds and returns the fields it adds to
the RawSession: ``device`` (``model.device.DEVICE_DTYPE`` records moved onto
the collector's clock), ``device_names`` and ``device_threads``.

The extension (``cupti_observer.cpp``) is built like the op observer (cached,
locked, checked; no compiler when cached) against the CUPTI headers found
beside the installed torch: the ``nvidia-cuda-cupti`` wheel's
(``nvidia/cu13/include`` or ``nvidia/cuda_cupti/include``), else the CUDA
toolkit's ``extras/CUPTI``. At run time it loads the ``libcupti`` that torch
already loaded, so that Kineto and opscope share CUPTI's one state.

Example::

    >>> find_headers(["/nonexistent"]) is None
    True
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from opscope.collect.native.build import BuildFailed, NativeExtension
from opscope.model.device import DEVICE_DTYPE

SOURCE = Path(__file__).with_name("cupti_observer.cpp")
# (folder of cupti_activity.h, folder of cuda.h) relative to a site-packages folder
_WHEEL_LAYOUTS = [("nvidia/cu13/include", "nvidia/cu13/include"),
                  ("nvidia/cuda_cupti/include", "nvidia/cuda_runtime/include")]
_LIB_GLOBS = ["nvidia/cu13/lib/libcupti.so*", "nvidia/cuda_cupti/lib/libcupti.so*"]


def _site_folders() -> List[str]:
    return [p for p in sys.path if p and os.path.isdir(p)]


def _torch_cuda_major() -> Optional[str]:
    """"12" or "13" for a CUDA build of torch; None for a CPU build."""
    try:
        import torch

        version = getattr(torch.version, "cuda", None)
    except Exception:  # noqa: BLE001
        return None
    return version.split(".")[0] if version else None


def _by_torch_cuda(pairs: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """The wheel layouts, the one matching torch's CUDA first (its CUPTI's structs)."""
    major = _torch_cuda_major()
    if major == "12":
        return list(reversed(pairs))
    return pairs


def _toolkit_roots() -> List[str]:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return [r for r in roots if r and os.path.isdir(r)]


def find_headers(sites: Optional[Sequence[str]] = None) -> Optional[Tuple[str, str]]:
    """(folder of cupti_activity.h, folder of cuda.h), or None when none is installed."""
    candidates = []
    for site in (sites if sites is not None else _site_folders()):
        candidates += [(os.path.join(site, a), os.path.join(site, b))
                       for a, b in _by_torch_cuda(_WHEEL_LAYOUTS)]
    if sites is None:
        for root in _toolkit_roots():
            candidates.append((os.path.join(root, "extras/CUPTI/include"),
                               os.path.join(root, "include")))
    for cupti_dir, cuda_dir in candidates:
        if os.path.isfile(os.path.join(cupti_dir, "cupti_activity.h")):
            if not os.path.isfile(os.path.join(cuda_dir, "cuda.h")):
                # the toolkit's cuda.h serves a wheel's CUPTI headers too
                found = [os.path.join(r, "include") for r in _toolkit_roots()
                         if os.path.isfile(os.path.join(r, "include", "cuda.h"))]
                if not found:
                    continue
                cuda_dir = found[0]
            return cupti_dir, cuda_dir
    return None


def latest_struct(header_text: str, base: str) -> Optional[str]:
    """The newest versioned struct ``base<N>`` the header defines.

    >>> latest_struct("} CUpti_ActivityKernel9;\\n} CUpti_ActivityKernel13;", "CUpti_ActivityKernel")
    'CUpti_ActivityKernel13'
    """
    versions = [int(v) for v in re.findall(r"\}\s*" + base + r"(\d+)\s*;", header_text)]
    return f"{base}{max(versions)}" if versions else None


def build_options() -> Dict[str, Any]:
    """Include folders, the record structs' names and the build-key part for the build."""
    found = find_headers()
    if found is None:
        raise BuildFailed("no CUPTI headers found (pip install nvidia-cuda-cupti-cu12 "
                          "nvidia-cuda-runtime-cu12, or a CUDA toolkit with extras/CUPTI)")
    cupti_dir, cuda_dir = found
    include_dirs = [cupti_dir, cuda_dir]
    if not os.path.isfile(os.path.join(cuda_dir, "crt", "host_defines.h")):
        # cuda.h's own includes: the nvidia-cuda-crt wheel's, else the toolkit's
        more = [os.path.join(site, "nvidia/cu13/include") for site in _site_folders()]
        more += [os.path.join(site, "nvidia/cuda_nvcc/include") for site in _site_folders()]
        more += [os.path.join(r, "include") for r in _toolkit_roots()]
        crt = [d for d in more if os.path.isfile(os.path.join(d, "crt", "host_defines.h"))]
        if not crt:
            raise BuildFailed(f"{cuda_dir}/cuda.h needs crt/host_defines.h "
                              "(pip install nvidia-cuda-crt)")
        include_dirs.append(crt[0])
    text = Path(cupti_dir, "cupti_activity.h").read_text(errors="replace")
    structs = {"KERNEL": latest_struct(text, "CUpti_ActivityKernel"),
               "MEMCPY": latest_struct(text, "CUpti_ActivityMemcpy"),
               "MEMSET": latest_struct(text, "CUpti_ActivityMemset")}
    missing = [k for k, v in structs.items() if v is None]
    if missing:
        raise BuildFailed(f"{cupti_dir}/cupti_activity.h defines no {missing[0].lower()} record")
    cflags = [f"-DOPSCOPE_{k}_T={v}" for k, v in sorted(structs.items())]
    key = hashlib.sha256(text.encode() + " ".join(cflags).encode()).hexdigest()[:16]
    return {"include_dirs": include_dirs, "cflags": cflags, "key": key}


OBSERVER = NativeExtension(SOURCE, "opscope_cupti", "CUDA device collector",
                           "recording the CPU side only", extra=build_options,
                           takes="about 10 s")


def _loaded_cupti() -> Optional[str]:
    """The path of a libcupti this process already mapped (torch's), if any."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if "/libcupti.so" in path and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


def find_library() -> Optional[str]:
    """The libcupti to load: torch's own if mapped, else the wheel's, else the toolkit's."""
    path = _loaded_cupti()
    if path:
        return path
    globs = list(reversed(_LIB_GLOBS)) if _torch_cuda_major() == "12" else _LIB_GLOBS
    for site in _site_folders():
        for pattern in globs:
            hits = sorted(glob.glob(os.path.join(site, pattern)))
            if hits:
                return hits[0]
    for root in _toolkit_roots():
        hits = sorted(glob.glob(os.path.join(root, "extras/CUPTI/lib64/libcupti.so*")))
        if hits:
            return hits[0]
    return None


class CuptiUnavailable(RuntimeError):
    """CUPTI cannot record here; the message is the one line to show.

    ``said`` is True when that line was already printed (a failed build says so
    itself, once per process), so the window adds no second one.
    """

    def __init__(self, message: str, said: bool = False):
        super().__init__(message)
        self.said = said


_load_lock = threading.Lock()


def load_collector() -> Any:
    """The built extension with libcupti loaded; raises CuptiUnavailable saying why."""
    with _load_lock:
        ext = OBSERVER.load()
        if ext is None:
            raise CuptiUnavailable(OBSERVER.failure_reason() or "the device collector did not build",
                                   said=True)
        if ext.RECORD_SIZE != DEVICE_DTYPE.itemsize:
            raise CuptiUnavailable(f"device records are {ext.RECORD_SIZE} bytes, expected "
                                   f"{DEVICE_DTYPE.itemsize}")
        library = find_library()
        if library is None:
            raise CuptiUnavailable("no libcupti found (pip install nvidia-cuda-cupti-cu12)")
        try:
            ext.load(library)
        except RuntimeError as exc:
            raise CuptiUnavailable(str(exc)) from None
        return ext


def _python_threads(ext: Any) -> Dict[int, int]:
    """CUPTI's id of this thread -> its OS id (other threads are matched by time)."""
    return {int(ext.thread_key()): threading.get_native_id()}


def to_collector_clock(records: np.ndarray, pairs: Sequence[Tuple[int, int]]) -> None:
    """Move CUPTI times onto CLOCK_MONOTONIC in place, through (cupti, monotonic) pairs.

    Two pairs (start and stop) also correct a drift between the clocks.

    >>> r = np.zeros(1, DEVICE_DTYPE); r["start_ns"], r["end_ns"] = 1_000_500, 1_000_900
    >>> to_collector_clock(r, [(1_000_000, 500), (2_000_000, 1_000_500)])
    >>> int(r["start_ns"][0]), int(r["end_ns"][0])
    (1000, 1400)
    """
    if len(records) == 0 or not pairs:
        return
    (c0, m0), (c1, m1) = pairs[0], pairs[-1]
    for field in ("start_ns", "end_ns"):
        t = records[field]
        live = t > 0  # 0: CUPTI did not time it
        if c1 > c0:
            rate = (m1 - m0) / (c1 - c0)
            moved = m0 + np.rint((t - c0) * rate).astype(np.int64)
        else:
            moved = t - (c0 - m0)
        records[field] = np.where(live, moved, 0)


def taken_fields(ext: Any, pairs: Sequence[Tuple[int, int]],
                 threads: Dict[int, int]) -> Dict[str, Any]:
    """The extension's records since its last take, as RawSession fields on our clock."""
    blob, names, dropped = ext.take()
    records = np.frombuffer(blob, dtype=DEVICE_DTYPE).copy()
    to_collector_clock(records, pairs)
    if dropped:
        import warnings

        warnings.warn(f"opscope: {dropped} device records dropped (over the collector's "
                      "bound)", RuntimeWarning, stacklevel=4)
    return dict(device=records, device_names=list(names), device_threads=dict(threads))


class CuptiProbe:
    """One window's device collector: ``start()``, then ``stop() -> RawSession fields``."""

    name = "cuda"

    def __init__(self) -> None:
        self._ext: Any = None
        self._pairs: List[Tuple[int, int]] = []
        self._threads: Dict[int, int] = {}

    def start(self) -> None:
        """Enable CUPTI; raises CuptiUnavailable (one line) when it cannot record."""
        if _torch_profiler_running():
            # Kineto holds CUPTI's buffer callbacks: taking them would lose its records
            raise CuptiUnavailable("torch.profiler is recording in this process and holds "
                                   "CUPTI; its trace has the device side")
        ext = load_collector()
        ext.take()  # whatever an earlier window left unread is not this window's
        try:
            ext.start()
        except RuntimeError as exc:
            raise CuptiUnavailable(str(exc)) from None
        self._ext = ext
        self._pairs = [tuple(ext.clock_pair())]
        self._threads = _python_threads(ext)

    def stop(self) -> Dict[str, Any]:
        """Flush CUPTI and return ``device``, ``device_names`` and ``device_threads``."""
        ext, self._ext = self._ext, None
        if ext is None:
            return {}
        _synchronize()
        ext.stop()
        self._pairs.append(tuple(ext.clock_pair()))
        return taken_fields(ext, self._pairs, self._threads)

    def forget_after_fork(self) -> None:
        """In a forked child: CUPTI's recording is the parent's; drop it untouched."""
        self._ext = None

    def discard(self) -> None:
        """Stop without keeping anything; never raises."""
        ext, self._ext = self._ext, None
        if ext is not None:
            try:
                ext.stop()
                ext.take()
            except Exception:  # noqa: BLE001  (nothing is kept: its error neither)
                pass


def _torch_profiler_running() -> bool:
    """Whether torch's own profiler (Kineto) is recording in this process."""
    try:
        import torch

        return bool(torch._C._autograd._profiler_enabled())
    except Exception:  # noqa: BLE001  (an old or odd torch: assume it is not)
        return False


def _synchronize() -> None:
    """Wait for the device work already launched, so its records are in the flush."""
    try:
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001  (a broken device must not stop the stop)
        pass
