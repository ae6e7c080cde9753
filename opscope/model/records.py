"""The recorded session: what a collector wrote, before any analysis.

Both sources produce a :class:`RawSession`: the live collectors (native and
Python, ``opscope.collect``) and saved traces (``opscope.load``). Records are
one numpy structured array (``RECORD_DTYPE``, 48 bytes a record); recorded
inputs are int64 blobs, one per thread, in the encoding ``decode_inputs`` reads.
Collectors write this format; nothing here touches torch.

Example::

    >>> import numpy as np
    >>> raw = RawSession.empty()
    >>> len(raw.records)
    0
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

RECORD_DTYPE = np.dtype(
    [
        ("start_ns", "<i8"),
        ("end_ns", "<i8"),
        ("seq_nr", "<i8"),
        ("name_id", "<i4"),
        ("thread_index", "<i4"),
        ("fwd_thread_id", "<u4"),
        ("rf_thread_id", "<u4"),
        ("input_offset", "<u4"),
        ("scope", "u1"),
        ("flags", "u1"),
        ("pad", "<u2"),
    ]
)
NO_INPUTS = 0xFFFFFFFF
FLAG_UNFINISHED = 1
FLAG_ASYNC = 2
FLAG_MEMORY = 4  # a top-level "[memory]" event: an allocation made outside any op
FLAG_PYTHON_FUNCTION = 8  # a saved trace's ``python_function`` event (torch's with_stack)
FLAG_CUDA_RUNTIME = 16  # a CUDA runtime API call (a device collector's, on its host thread)
FLAG_CUDA_DRIVER = 32  # a CUDA driver API call
FLAG_SOURCE_STACK = 64  # its stack is final: a compiled kernel's model source lines

# One allocation (bytes > 0) or free (bytes < 0) reported by a torch allocator
# (collect/native/observer/records.h: MemRecord). device_type is c10::DeviceType (0: CPU).
MEMORY_DTYPE = np.dtype(
    [
        ("time_ns", "<i8"),
        ("addr", "<i8"),
        ("bytes", "<i8"),
        ("total_allocated", "<i8"),
        ("total_reserved", "<i8"),
        ("thread_index", "<i4"),
        ("device_type", "i1"),
        ("device_index", "i1"),
        ("pad", "<u2"),
    ]
)
NO_STACK = -1

# at::RecordScope values
SCOPE_FUNCTION = 0
SCOPE_BACKWARD_FUNCTION = 1
SCOPE_USER = 7

# Input kinds in the int64 encoding (see collect/native/observer/inputs.h: encode_inputs)
INPUT_NONE, INPUT_TENSOR, INPUT_INT, INPUT_DOUBLE, INPUT_BOOL = 0, 1, 2, 3, 4
INPUT_TENSOR_LIST, INPUT_INT_LIST, INPUT_STRING = 5, 6, 7

# c10::ScalarType index -> the name torch.profiler prints in "Input type"
SCALAR_TYPE_NAMES = [
    "unsigned char", "signed char", "short int", "int", "long int", "c10::Half",
    "float", "double", "c10::complex<c10::Half>", "c10::complex<float>",
    "c10::complex<double>", "bool", "c10::qint8", "c10::quint8", "c10::qint32",
    "c10::BFloat16", "c10::quint4x2", "c10::quint2x4", "c10::bits1x8",
    "c10::bits2x4", "c10::bits4x2", "c10::bits8", "c10::bits16",
    "c10::Float8_e5m2", "c10::Float8_e4m3fn", "c10::Float8_e5m2fnuz",
    "c10::Float8_e4m3fnuz",
]


@dataclass
class RecordedInputs:
    """Decoded inputs of one op, in torch.profiler's terms.

    ``shapes`` is ``Input Dims``, ``types`` is ``Input type``, ``strides`` is
    ``Input Strides`` and ``concrete`` is ``Concrete Inputs`` (strings).
    """

    shapes: List[list]
    types: List[str]
    strides: List[list]
    concrete: List[str]


def decode_inputs(blob: np.ndarray, offset: int, end: Optional[int] = None) -> RecordedInputs:
    """Decode the inputs that start at ``offset`` of an int64 ``blob``.

    ``end``, the encoding's end when the caller knows it, saves a guess: the
    words are read as one slice of Python ints, not numpy scalars one by one.

    >>> rec = decode_inputs(np.array([1, INPUT_INT, 7, 99], dtype=np.int64), 0)
    >>> rec.types, rec.concrete
    (['Scalar'], ['7'])
    """
    if end is not None:
        return _decode_words(blob[offset:end].tolist())[0]
    guess = blob[offset:offset + 256].tolist()
    try:
        rec, used = _decode_words(guess)
        if used <= len(guess):
            return rec
    except IndexError:
        pass
    return _decode_words(blob[offset:].tolist())[0]  # longer than the guess


def _decode_words(words: List[int]) -> Tuple[RecordedInputs, int]:
    """(decoded inputs, words the encoding takes) from the words of one encoding."""
    n = words[0]
    pos = 1
    shapes: List[list] = []
    types: List[str] = []
    strides: List[list] = []
    concrete: List[str] = []
    for _ in range(n):
        kind = words[pos]
        pos += 1
        if kind == INPUT_TENSOR:
            nd = words[pos]
            pos += 1
            shapes.append(words[pos : pos + nd])
            pos += nd
            strides.append(words[pos : pos + nd])
            pos += nd
            dtype = words[pos]
            pos += 1
            types.append(SCALAR_TYPE_NAMES[dtype] if 0 <= dtype < len(SCALAR_TYPE_NAMES) else "")
            concrete.append("")
        elif kind in (INPUT_INT, INPUT_DOUBLE, INPUT_BOOL):
            value = words[pos]
            pos += 1
            if kind == INPUT_DOUBLE:
                text = repr(struct.unpack("<d", struct.pack("<q", value))[0])
            elif kind == INPUT_BOOL:
                text = "True" if value else "False"
            else:
                text = str(value)
            shapes.append([])
            strides.append([])
            types.append("Scalar")
            concrete.append(text)
        elif kind == INPUT_TENSOR_LIST:
            pos += 1
            shapes.append([])
            strides.append([])
            types.append("TensorList")
            concrete.append("")
        elif kind == INPUT_INT_LIST:
            count = words[pos]
            pos += 1
            values = words[pos : pos + count]
            pos += count
            shapes.append([])
            strides.append([])
            types.append("ScalarList")
            concrete.append(str(values))
        elif kind == INPUT_STRING:
            shapes.append([])
            strides.append([])
            types.append("String")
            concrete.append("")
        else:
            shapes.append([])
            strides.append([])
            types.append("")
            concrete.append("")
    return RecordedInputs(shapes, types, strides, concrete), pos


def encode_plain_value(value: object, out: List[int]) -> None:
    """Append the encoding of one non-tensor input: a scalar, an int list, a string.

    >>> out = []; encode_plain_value(3, out); encode_plain_value([2, 5], out); out
    [2, 3, 6, 2, 2, 5]
    """
    if isinstance(value, bool):
        out.extend((INPUT_BOOL, int(value)))
    elif isinstance(value, int):
        out.extend((INPUT_INT, value))
    elif isinstance(value, float):
        out.extend((INPUT_DOUBLE, struct.unpack("<q", struct.pack("<d", value))[0]))
    elif isinstance(value, (list, tuple)) and all(isinstance(x, int) for x in value):
        out.extend((INPUT_INT_LIST, len(value)))
        out.extend(int(x) for x in value)
    elif isinstance(value, str):
        out.append(INPUT_STRING)
    else:
        out.append(INPUT_NONE)


@dataclass
class RawSession:
    """Everything one collector recorded between start and stop.

    Times are CLOCK_MONOTONIC ns; ``epoch_offset_ns`` turns them into Unix ns.
    """

    records: np.ndarray
    inputs: List[np.ndarray]  # per thread_index: int64 blob
    thread_ids: List[int]  # per thread_index: OS thread id
    names: List[str]  # name_id -> name
    start_ns: int
    stop_ns: int
    epoch_offset_ns: int
    collector: str = "native"
    process_id: int = 0
    metadata: dict = field(default_factory=dict)
    # profile_memory: MEMORY_DTYPE records, in time order per thread.
    memory: np.ndarray = field(default_factory=lambda: np.zeros(0, MEMORY_DTYPE))
    # with_stack: a stack id per record (NO_STACK: none) and, per stack id, the
    # Python frames innermost first, as "file.py(12): function".
    stack_ids: Optional[np.ndarray] = None
    stack_table: Optional[List[List[str]]] = None
    # What a source knows besides its records. ``build_session`` takes it all,
    # so nothing edits a session after it is built.
    # opscope.itt.mark() calls: (collector-clock ns, OS thread id, message)
    marks: List[Tuple[int, int, str]] = field(default_factory=list)
    # profile_memory: tensors seen in known roles (model.memory.SIGHTING_DTYPE)
    memory_sightings: Optional[np.ndarray] = None
    # with_modules: range name -> model.modules.ModuleInfo, and every forward call
    modules: Optional[Dict[str, Any]] = None
    module_calls: List[Any] = field(default_factory=list)
    # a saved trace's own FLOPs per record (None: estimate them from the inputs)
    flops: Optional[np.ndarray] = None
    # OS thread id -> name, from a saved trace's metadata events
    thread_names: Dict[int, str] = field(default_factory=dict)
    # what the user asked for (model.session.OPTION_NAMES); None: all off
    options: Optional[Dict[str, bool]] = None
    # False: the stacks are final per record (a saved trace's); True: a backward
    # node takes its forward op's stack (what a collector recorded)
    link_backward_stacks: bool = True
    # a saved trace: its path, and what its python_function records are (see
    # load.trace_events.PYTHON_FUNCTION_RULES; "hidden": in the tree, not rows)
    source_path: str = ""
    python_functions: str = "counted"
    # A device collector's (model.device.DEVICE_DTYPE records on the collector clock,
    # their name table, and CUPTI's thread id -> OS thread id where known); None: none.
    # ``correlation``: per record, the CUDA correlation id of an API call row (0: none).
    device: Optional[np.ndarray] = None
    device_names: List[str] = field(default_factory=list)
    device_threads: Dict[int, int] = field(default_factory=dict)
    correlation: Optional[np.ndarray] = None
    # torch.compile'd graphs (a live recording's): per "## Call CompiledFxGraph <key> ##"
    # name, the call sites Inductor noted for each graph under that key (None: none noted);
    # see opscope.collect.inductor_sites and opscope.analysis.compiled_modules.
    compiled_sites: Optional[Dict[str, List[Any]]] = None
    # with_modules: record index -> the modules of a compiled kernel fused from FX nodes
    # of several modules (model.modules.fused_module_entries); only such kernels are keys
    fused_modules: Dict[int, Tuple[str, ...]] = field(default_factory=dict)
    # a saved trace: record index -> the collective facts in its args (process group,
    # "Seq", msg nelems, dtype; model.collective_facts); a live recording's come from
    # the flight recorder's rows in ``metadata`` instead (analysis.flight_recorder)
    collective_facts: Dict[int, Any] = field(default_factory=dict)
    # with_modules: range name -> parameter count of the inner modules of compiled modules
    # (their ranges are made by analysis.compiled_modules, not by the module hooks)
    compiled_module_params: Dict[str, int] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> "RawSession":
        return cls(np.zeros(0, RECORD_DTYPE), [], [], [], 0, 0, 0)

    def inputs_of(self, thread_index: int, offset: int) -> Optional[RecordedInputs]:
        """Decoded inputs of one record, or None when none were recorded."""
        if offset == NO_INPUTS or thread_index >= len(self.inputs):
            return None
        blob = self.inputs[thread_index]
        if offset >= len(blob):
            return None
        return decode_inputs(blob, offset)


def records_from_rows(rows: Sequence[Tuple]) -> np.ndarray:
    """Build a record array from tuples in RECORD_DTYPE field order."""
    return np.array(list(rows), dtype=RECORD_DTYPE)
