"""The device-event table: what a device collector (CUPTI) recorded, before analysis.

``DEVICE_DTYPE`` mirrors ``DeviceRecord`` of ``collect/native/cupti_observer.cpp``
byte for byte (104 bytes a record). Kernels, copies and memsets run on a
device and stream; runtime and driver calls run on a host thread and carry
the correlation id that ties them to the device work they launched. Times
are on the collector's clock (CLOCK_MONOTONIC ns) once the source has moved
them there. Nothing here touches torch or CUPTI.

Example::

    >>> recs = np.zeros(2, DEVICE_DTYPE)
    >>> recs["kind"] = [KIND_MEMCPY, KIND_MEMSET]
    >>> recs["copy_kind"][0], recs["src_kind"][0], recs["dst_kind"][0] = 1, 2, 3
    >>> recs["src_kind"][1] = 3
    >>> device_event_names(recs, [])
    ['Memcpy HtoD (Pinned -> Device)', 'Memset (Device)']
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Sequence

import numpy as np

DEVICE_DTYPE = np.dtype([
    ("start_ns", "<i8"), ("end_ns", "<i8"), ("bytes", "<i8"), ("graph_node", "<u8"),
    ("correlation", "<u4"), ("thread", "<u4"), ("stream", "<u4"), ("context", "<u4"),
    ("name_id", "<i4"), ("device", "<i4"), ("grid", "<i4", (3,)), ("block", "<i4", (3,)),
    ("shared_static", "<i4"), ("shared_dynamic", "<i4"), ("graph_id", "<u4"),
    ("registers", "<u2"), ("kind", "u1"), ("copy_kind", "u1"), ("src_kind", "u1"),
    ("dst_kind", "u1"), ("pad", "u1", (6,)),
])
assert DEVICE_DTYPE.itemsize == 104

USER_SPAN_DTYPE = np.dtype([("row", "<i8"), ("device", "<i4"), ("stream", "<u4"),
                            ("start_ns", "<i8"), ("end_ns", "<i8")])

KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, KIND_RUNTIME, KIND_DRIVER, KIND_SYNC = 1, 2, 3, 4, 5, 6
DEVICE_KINDS = (KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET)  # work that runs on the device
# the Chrome trace's categories, as torch.profiler writes them
CATEGORIES = {KIND_KERNEL: "kernel", KIND_MEMCPY: "gpu_memcpy", KIND_MEMSET: "gpu_memset",
              KIND_RUNTIME: "cuda_runtime", KIND_DRIVER: "cuda_driver"}

# CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind, in the words torch's traces use
COPY_KINDS = ["Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD",
              "HtoH", "PtoP"]
MEMORY_KINDS = ["Unknown", "Pageable", "Pinned", "Device", "Array", "Managed",
                "Device Static", "Managed Static"]

_VERSION_SUFFIX = re.compile(r"_v\d+$")


def api_name(name: str) -> str:
    """A CUPTI callback name as torch's traces print it (no ``_v7000`` suffix).

    >>> api_name("cudaLaunchKernel_v7000"), api_name("cuLaunchKernel")
    ('cudaLaunchKernel', 'cuLaunchKernel')
    """
    return _VERSION_SUFFIX.sub("", name)


def _kind_word(words: Sequence[str], code: int) -> str:
    return words[code] if 0 <= code < len(words) else "Unknown"


def device_event_names(records: np.ndarray, names: Sequence[str]) -> List[str]:
    """The display name of each record: the kernel's, the API's, or a copy's words."""
    out: List[str] = []
    for kind, name_id, copy_kind, src, dst in zip(
            records["kind"].tolist(), records["name_id"].tolist(), records["copy_kind"].tolist(),
            records["src_kind"].tolist(), records["dst_kind"].tolist()):
        if kind in (KIND_MEMCPY, KIND_MEMSET) and 0 <= name_id < len(names):
            out.append(names[name_id])  # a saved trace's, as written
        elif kind == KIND_MEMCPY:
            out.append(f"Memcpy {_kind_word(COPY_KINDS, copy_kind)} "
                       f"({_kind_word(MEMORY_KINDS, src)} -> {_kind_word(MEMORY_KINDS, dst)})")
        elif kind == KIND_MEMSET:
            out.append(f"Memset ({_kind_word(MEMORY_KINDS, src)})")
        elif 0 <= name_id < len(names):
            text = names[name_id]
            out.append(api_name(text) if kind in (KIND_RUNTIME, KIND_DRIVER) else text)
        else:
            out.append("<unnamed>")
    return out


@dataclass
class DeviceEvents:
    """The device work of a session, linked to the ops that launched it.

    ``records`` (DEVICE_DTYPE, kernels, copies and memsets only, in start order)
    with ``names`` per record; ``launch_row`` is the table row of the runtime or
    driver call that launched each (-1: its launch fell outside the session), and
    ``owner_row`` the row of the op or range that made that call (-1: none).
    """

    records: np.ndarray
    names: List[str]
    launch_row: np.ndarray
    owner_row: np.ndarray
    # torch's ``gpu_user_annotation``: per user range and stream that ran its work,
    # the span from its first device event's start to its last one's end
    # (USER_SPAN_DTYPE, ``row`` the range's table row)
    user_spans: np.ndarray = field(default_factory=lambda: np.zeros(0, USER_SPAN_DTYPE))

    def __len__(self) -> int:
        return len(self.records)

    @property
    def duration_ns(self) -> np.ndarray:
        return np.maximum(self.records["end_ns"] - self.records["start_ns"], 0)
