"""A collective's facts: its process group, sequence number, element counts and dtype.

torch.profiler writes them as args of its ``record_param_comms`` events (from
``ParamCommsDebugInfo``; NCCL emits them, gloo does not in torch 2.13); opscope
writes the same args, in the same spelling, on each collective's dispatcher op
(``c10d::allreduce_``), from torch's flight recorder
(``opscope.analysis.flight_recorder``), and from the process-group calls of
the job's Python (``opscope.collect.job.process_group_calls``). ``"Collective Call
Site"`` is opscope's own: the innermost frame of the user's code that issued it. A point-to-point
op's peer is torch's ``"Src Rank"`` (a receive) or ``"Dst Rank"`` (a send).

Example::

    >>> facts = CollectiveFacts("1", "undefined", (0, 1), 3, 4, 8, "Float", "t.py(9): f")
    >>> args = facts.to_args(); args["Process Group Ranks"], args["In msg nelems"]
    ('[0, 1]', 4)
    >>> CollectiveFacts.from_args(args) == facts, facts.nbytes
    (True, 16)
    >>> CollectiveFacts.from_args({"Collective name": "allreduce"}) is None
    True
    >>> send = CollectiveFacts("0", seq=7, in_nelems=5, dtype="Float", dst_rank=1)
    >>> send.to_args()["Dst Rank"], CollectiveFacts.from_args(send.to_args()) == send
    (1, True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

# torch's spellings (torch/csrc/profiler/util.h, kProcessGroupName and the others)
ARG_PG_NAME = "Process Group Name"
ARG_PG_DESC = "Process Group Description"
ARG_PG_RANKS = "Process Group Ranks"
ARG_GROUP_SIZE = "Group size"
ARG_SEQ = "Seq"
ARG_IN_NELEMS = "In msg nelems"
ARG_OUT_NELEMS = "Out msg nelems"
ARG_DTYPE = "dtype"
ARG_SRC_RANK = "Src Rank"  # a receive's peer (global rank)
ARG_DST_RANK = "Dst Rank"  # a send's peer
ARG_CALL_SITE = "Collective Call Site"  # opscope's own
# an event that has one of these carries a collective's facts
MARKER_ARGS = (ARG_PG_NAME, ARG_SEQ)

# torch's ScalarType names (c10::toString, what "dtype" holds) -> bytes per element
SCALAR_TYPE_BYTES = {
    "Byte": 1, "Char": 1, "Short": 2, "Int": 4, "Long": 8, "Half": 2, "Float": 4,
    "Double": 8, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16, "Bool": 1,
    "QInt8": 1, "QUInt8": 1, "QInt32": 4, "BFloat16": 2, "QUInt4x2": 1, "QUInt2x4": 1,
    "Float8_e5m2": 1, "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1,
    "UInt16": 2, "UInt32": 4, "UInt64": 8,
}
# frames of these files are torch's or opscope's, never the user's call site
_LIBRARY_MARKERS = ("/torch/", "/opscope/", "<built-in", "site-packages/", "torch/nn/")


def user_call_site(frames: Optional[List[str]]) -> Optional[str]:
    """The innermost frame (frames innermost first) that is not torch's or opscope's, or None.

    >>> user_call_site(["torch/distributed/c10d.py(9): all_reduce", "train.py(12): main"])
    'train.py(12): main'
    """
    for frame in frames or ():
        text = "/" + frame.replace("\\", "/")
        if not any(marker in text for marker in _LIBRARY_MARKERS) and "torch/distributed" \
                not in text:
            return frame
    return None


def ranks_text(ranks: Optional[Sequence[int]]) -> Optional[str]:
    """A group's ranks as torch writes ``"Process Group Ranks"``: ``"[0, 1]"`` (None: None)."""
    return None if ranks is None else "[" + ", ".join(map(str, ranks)) + "]"


def _int(value: Any) -> Optional[int]:
    if type(value) is int:
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def _ranks(value: Any) -> Optional[Tuple[int, ...]]:
    """torch's ``"[0, 1]"`` (a string), or a list of ints, as a tuple; None otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(type(r) is int for r in value):
        return tuple(value)
    return None


@dataclass(frozen=True)
class CollectiveFacts:
    """What one collective call says about itself (None: not known)."""

    pg: Optional[str] = None
    pg_desc: Optional[str] = None
    pg_ranks: Optional[Tuple[int, ...]] = None
    seq: Optional[int] = None
    in_nelems: Optional[int] = None
    out_nelems: Optional[int] = None
    dtype: Optional[str] = None
    call_site: Optional[str] = None
    src_rank: Optional[int] = None  # a point-to-point receive's peer
    dst_rank: Optional[int] = None  # a point-to-point send's peer

    @property
    def nbytes(self) -> Optional[int]:
        """Input bytes: input elements times the dtype's size (None where either is unknown)."""
        size = SCALAR_TYPE_BYTES.get(self.dtype or "")
        return None if size is None or self.in_nelems is None else self.in_nelems * size

    def to_args(self) -> Dict[str, Any]:
        """The trace args, in torch's spelling, of the facts that are known."""
        pairs = ((ARG_PG_NAME, self.pg), (ARG_PG_DESC, self.pg_desc),
                 (ARG_PG_RANKS, ranks_text(self.pg_ranks)),
                 (ARG_GROUP_SIZE, None if self.pg_ranks is None else len(self.pg_ranks)),
                 (ARG_SEQ, self.seq), (ARG_IN_NELEMS, self.in_nelems),
                 (ARG_OUT_NELEMS, self.out_nelems), (ARG_DTYPE, self.dtype),
                 (ARG_SRC_RANK, self.src_rank), (ARG_DST_RANK, self.dst_rank),
                 (ARG_CALL_SITE, self.call_site))
        return {k: v for k, v in pairs if v is not None}

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Optional["CollectiveFacts"]:
        """The facts in a trace event's args; None without a group name or a sequence number.

        Values of the wrong type count as absent; torch's ``"Seq"`` of ``-1`` (a
        backend that does not number) too.
        """
        seq = _int(args.get(ARG_SEQ))
        facts = cls(_str(args.get(ARG_PG_NAME)), _str(args.get(ARG_PG_DESC)),
                    _ranks(args.get(ARG_PG_RANKS)), seq if seq is None or seq >= 0 else None,
                    _int(args.get(ARG_IN_NELEMS)), _int(args.get(ARG_OUT_NELEMS)),
                    _str(args.get(ARG_DTYPE)), _str(args.get(ARG_CALL_SITE)),
                    _int(args.get(ARG_SRC_RANK)), _int(args.get(ARG_DST_RANK)))
        return facts if facts.pg is not None or facts.seq is not None else None
