"""The text report of ``opscope ranks``: per-rank table, collectives, stragglers, desync.

Example::

    >>> from opscope.analysis.ranks.analyse import RanksAnalysis, RankSummary
    >>> print(format_ranks(RanksAnalysis(1, [RankSummary(0, 2, 5.0, 8.0, 1.0, 0.5, 0.25, 4)],
    ...                                  [], [], [])))
    World size 1
    <BLANKLINE>
    rank  steps  mean step ms  compute ms  comm ms  wait ms  overlap ms  collectives
       0      2         5.000       8.000    1.000    0.500       0.250            4
    <BLANKLINE>
    Collectives: none matched
    <BLANKLINE>
    Stragglers: none
    <BLANKLINE>
    Desync: none
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from opscope.analysis.ranks.analyse import MatchedCollective, RanksAnalysis

DEFAULT_COLLECTIVE_LIMIT = 20
UNKNOWN_SIZE_NOTE = ("size ?: the traces hold no input shapes and no flight recorder sizes, "
                     "so the bytes are not known; record with torch's flight recorder on "
                     "(torch 2.13's default; TORCH_FR_BUFFER_SIZE=2000 on older torches) or "
                     "with record_shapes=True (opscope run --record-shapes)")


def _columns(header: Sequence[str], rows: List[Sequence[str]]) -> List[str]:
    """Right-aligned columns, two spaces apart."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    return ["  ".join(str(x).rjust(w) for x, w in zip(line, widths)).rstrip()
            for line in [header, *rows]]


def _size(nbytes: Optional[int]) -> str:
    """Bytes as B/KiB/MiB/GiB.

    >>> _size(None), _size(12), _size(4096), _size(3 << 20)
    ('?', '12 B', '4.0 KiB', '3.0 MiB')
    """
    if nbytes is None:
        return "?"
    value, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{nbytes} B" if unit == "B" else f"{value:.1f} {unit}"


def _collective_lines(collectives: List[MatchedCollective], limit: int) -> List[str]:
    if not collectives:
        return ["Collectives: none matched"]
    top = sorted(collectives, key=lambda c: (-c.max_wait_ms, c.pg, c.seq))
    top = top if limit < 0 else top[:limit]
    rows = []
    for c in top:
        ranks = sorted(c.ranks)
        rows.append((c.pg, str(c.seq), c.kind, _size(c.bytes),
                     " ".join(f"{r}:{c.ranks[r].start_ms:.3f}" for r in ranks),
                     " ".join(f"{r}:{c.ranks[r].wait_ms:.3f}" for r in ranks),
                     f"{min(a.transfer_ms for a in c.ranks.values()):.3f}"))
    shown = f"top {len(top)} of {len(collectives)} by wait" if len(top) < len(collectives) \
        else f"{len(collectives)}, by wait"
    unknown = [UNKNOWN_SIZE_NOTE] if any(c.bytes is None for c in top) else []
    return [f"Collectives ({shown}; arrival ms from the job's first event, rank:value)",
            *_columns(("pg", "seq", "kind", "size", "arrival ms", "wait ms", "transfer ms"),
                      rows), *unknown]


def rank_ranges(ranks: Sequence[int]) -> str:
    """Sorted ranks as runs: a world of a million ranks with two traces stays one short line.

    >>> rank_ranges([1, 2, 3, 5, 7, 8])
    '1-3, 5, 7-8'
    """
    runs: List[List[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def format_ranks(analysis: RanksAnalysis, *, limit: int = DEFAULT_COLLECTIVE_LIMIT) -> str:
    """The report as text; ``limit`` collectives (those with the longest wait, -1: all)."""
    lines = [f"World size {analysis.world_size}", ""]
    if analysis.missing_ranks:
        lines[-1:-1] = [f"No trace of rank {rank_ranges(analysis.missing_ranks)}"]
    lines += _columns(
        ("rank", "steps", "mean step ms", "compute ms", "comm ms", "wait ms", "overlap ms",
         "collectives"),
        [(str(r.rank), str(r.steps), f"{r.mean_step_ms:.3f}", f"{r.compute_ms:.3f}",
          f"{r.comm_ms:.3f}", f"{r.wait_ms:.3f}", f"{r.overlap_ms:.3f}", str(r.collectives))
         for r in analysis.ranks])
    lines += ["", *_collective_lines(analysis.collectives, limit), ""]
    if analysis.stragglers:
        lines.append("Stragglers (arrived last; the latest first)")
        lines += _columns(("rank", "late at", "mean lateness ms"),
                          [(str(s.rank), str(s.late_count), f"{s.mean_lateness_ms:.3f}")
                           for s in analysis.stragglers])
    else:
        lines.append("Stragglers: none")
    lines.append("")
    if not analysis.desync:
        lines.append("Desync: none")
    for d in analysis.desync:
        lines.append(f"Desync: process group {d.pg}, collective #{d.seq}: the ranks issued "
                     f"different collectives")
        for rank, kind in d.ranks.items():
            what = "nothing" if kind is None else f"{kind} ({_size(d.bytes[rank])}" + (
                f", {d.in_nelems[rank]} -> {d.out_nelems[rank]} elements"
                if d.in_nelems.get(rank) is not None else "") + (
                f", {d.dtypes[rank]}" if d.dtypes.get(rank) else "") + ")"
            site = d.call_sites.get(rank)
            lines.append(f"  rank {rank}: {what}" + (f" at {site}" if site else ""))
    return "\n".join(lines)
