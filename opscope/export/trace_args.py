"""The args an op's trace line carries beyond the fixed ones, rendered once per value.

``extra_args(session)`` gives, in write order, the parts that
``chrome_trace._op_lines`` picks per row: the recorded inputs, the module args, a
collective's facts, the FLOP estimate and the ``Call stack``. Each distinct value
(an input signature, a module, a stack) is rendered once into a ``StringTable``
and picked per row by index, so the per-row work is numpy's or the C renderer's.

Example::

    >>> table, index = intern_strings(['"a": 1, ', "", '"a": 1, '])
    >>> len(table), index.tolist()
    (1, [0, -1, 0])
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

import numpy as np

from opscope.model.arrays import distinct
from opscope.analysis.facts import module_ranges
from opscope.analysis.modules import module_hierarchy
from opscope.export.json_rows import StringTable
from opscope.model.modules import TRACE_ARG_FUSED, fused_modules_text
from opscope.model.session import ProfileSession


def intern_strings(per_row: List[str]) -> Tuple[StringTable, np.ndarray]:
    """Per-row strings as (distinct strings, index per row); '' becomes -1 (nothing).

    >>> table, index = intern_strings(["a", "", "b", "a"])
    >>> len(table), index.tolist()
    (2, [0, -1, 1, 0])
    """
    ids: Dict[str, int] = {"": -1}
    index = np.fromiter((ids.setdefault(text, len(ids) - 1) for text in per_row),
                        dtype=np.intp, count=len(per_row))
    del ids[""]
    return StringTable(list(ids)), index


def extra_args(session: ProfileSession) -> List[Any]:
    """Args beyond the fixed ones, in write order: each part is (strings, index per
    event), or the FLOP estimate per event (written where it is > 0).

    The parts are the recorded inputs, the module args, a collective's facts
    (``model.collective_facts``), ``flops`` and the ``Call stack``; each distinct
    input signature and stack is rendered once.
    """
    table = session.table
    parts: List[Any] = [_input_args(table)]
    if session.modules is not None or session.fused_modules:
        parts.append(intern_strings(_module_args(session)))
    if session.collective_facts:
        parts.append(_collective_args(session))
    if session.flops is not None:
        parts.append(np.asarray(session.flops, dtype=np.int64))
    if session.stacks is not None:
        rendered: Dict[int, int] = {}
        texts: List[str] = []

        def stack_index(stack) -> int:
            if not stack:
                return -1
            k = rendered.get(id(stack))
            if k is None:  # torch: innermost frame first, each followed by ';'
                k = rendered[id(stack)] = len(texts)
                texts.append('"Call stack": %s, ' % json.dumps(";".join(stack) + ";"))
            return k

        index = np.fromiter((stack_index(st) for st in session.stacks), dtype=np.intp,
                            count=len(session.stacks))
        parts.append((StringTable(texts), index))
    return parts


def _module_args(session: ProfileSession) -> List[str]:
    """Per event, its rendered module args ('' when none).

    An op gets ``"Module Hierarchy"`` (``Model.encoder.0``). A module range
    (``with_modules``) is marked by ``"Module Class"``, ``"Module Path"``,
    ``"Module Hierarchy"`` and ``"Module Parameters"`` (see ``opscope.model.modules``).
    A kernel fused from several modules adds ``"Fused Modules"`` (``0.ln (LayerNorm) x10; ..``).
    """
    out = [""] * len(session.table)
    rendered: Dict[str, str] = {}
    for i, text in enumerate(module_hierarchy(session)):
        if text:  # each text rendered once
            out[i] = rendered.get(text) or rendered.setdefault(
                text, '"Module Hierarchy": %s, ' % json.dumps(text))
    ranges = np.flatnonzero(module_ranges(session))
    for name_id in distinct(session.table.name_id[ranges]).tolist():  # once per module
        text = "".join("%s: %s, " % (json.dumps(k), json.dumps(v)) for k, v in session.modules[
            session.table.symbols.names[name_id]].trace_args().items())
        for i in ranges[session.table.name_id[ranges] == name_id].tolist():
            out[i] = text
    for i, entries in session.fused_modules.items():
        out[i] += "%s: %s, " % (json.dumps(TRACE_ARG_FUSED),
                                json.dumps(fused_modules_text(entries)))
    return out


def _collective_args(session: ProfileSession) -> Tuple[StringTable, np.ndarray]:
    """A collective's facts as torch spells them on ``record_param_comms``
    (``"Process Group Name"``, ``"Seq"``, ``"In msg nelems"``...), on the rows that have them."""
    texts: Dict[str, int] = {}
    index = np.full(len(session.table), -1, dtype=np.intp)
    for row, facts in session.collective_facts.items():
        text = "".join("%s: %s, " % (json.dumps(k), json.dumps(v))
                       for k, v in facts.to_args().items())
        index[row] = texts.setdefault(text, len(texts))
    return StringTable(list(texts)), index


def _input_args(table) -> Tuple[StringTable, np.ndarray]:
    """Rendered input args per distinct signature, and each event's signature (-1: none).

    A record without inputs (a user range) gets none, as torch writes its ranges.
    """
    sig, decoded = table.input_signatures()
    strings: Dict[Tuple[str, ...], str] = {}  # string lists repeat across signatures

    def string_list(values: List[str]) -> str:
        key = tuple(values)
        text = strings.get(key)
        if text is None:
            text = strings[key] = json.dumps(values)
        return text

    # shapes and strides are lists of int lists: str() writes them as json.dumps does
    rendered = [('"Concrete Inputs": %s, "Input type": %s, "Input Strides": %s, '
                 '"Input Dims": %s, ' % (string_list(rec.concrete), string_list(rec.types),
                                         str(rec.strides), str(rec.shapes)))
                if rec.types else "" for rec in decoded]
    return StringTable(rendered), sig
