"""Bulk JSON line rendering (export/json_rows.py) equals plain Python formatting."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opscope.export.json_rows import JsonRows, StringTable, number_words


def as_text(words: np.ndarray) -> list:
    return [bytes(row).replace(b"\0", b"").decode() for row in words]


def micros(ns: int) -> str:
    sign = "-" if ns < 0 else ""
    q, r = divmod(abs(ns), 1000)
    return f"{sign}{q}.{r:03d}"


@pytest.mark.parametrize("seed", range(5))
def test_numbers_match_str(seed):
    rng = np.random.default_rng(seed)
    magnitude = 10 ** rng.integers(0, 19, size=500)
    values = (rng.random(500) * magnitude).astype(np.int64) * rng.choice([-1, 1], 500)
    values[:7] = [0, 1, -1, 999, 1000, np.iinfo(np.int64).max, np.iinfo(np.int64).min]
    assert as_text(number_words(values)) == [str(v) for v in values.tolist()]
    small = values // 16  # ns -> us text of any sign
    assert as_text(number_words(small, micros=True)) == [micros(v) for v in small.tolist()]


def test_most_negative_int64_keeps_all_its_digits():
    values = np.array([np.iinfo(np.int64).min, 5], dtype=np.int64)
    assert as_text(number_words(values)) == [str(v) for v in values.tolist()]


def reference_line(name, ts, dur, seq, extra):
    args = '"Sequence number": %d, ' % seq if seq >= 0 else ""
    return ('{"name": %s, "ts": %s, "dur": %s, "args": {%s%s"x": 1}}'
            % (json.dumps(name), micros(ts), micros(dur), args, extra))


@pytest.mark.parametrize("rows_per_chunk", [0, 1, 7, 64])
def test_layout_equals_reference_lines(rows_per_chunk):
    rng = np.random.default_rng(7)
    n = 300
    names = ["aten::add", "ünïcode ✓", 'quote " and \\ back', "x" * 200, ""]
    extras = ['"Call stack": "a.py(1): f;", ', "", '"Input Dims": [[2, 3]], ']
    name_id = rng.integers(0, len(names), n)
    extra_id = rng.integers(-1, len(extras), n)  # -1: none
    ts = rng.integers(0, 10 ** 13, n)
    dur = rng.integers(0, 10 ** 7, n)
    seq = rng.integers(-1, 3000, n)
    has_seq = seq >= 0

    rows = JsonRows(n)
    rows.text('{"name": ')
    rows.choice(StringTable([json.dumps(x) for x in names]), name_id)
    rows.text(', "ts": ')
    rows.number(ts, micros=True)
    rows.text(', "dur": ')
    rows.number(dur, micros=True)
    rows.text(', "args": {')
    rows.text('"Sequence number": ', has_seq)
    rows.number(seq, present=has_seq)
    rows.text(", ", has_seq)
    rows.choice(StringTable(extras), extra_id)
    rows.text('"x": 1}}')
    text = b",\n".join(bytes(c) for c in rows.chunks(",\n", rows_per_chunk)).decode()

    expected = ",\n".join(
        reference_line(names[k], t, d, s, extras[e] if e >= 0 else "")
        for k, t, d, s, e in zip(name_id.tolist(), ts.tolist(), dur.tolist(),
                                 seq.tolist(), extra_id.tolist()))
    assert text == expected
    assert len(json.loads("[" + text + "]")) == n


def test_no_rows_and_render():
    assert JsonRows(0).render(",\n") == b""
    rows = JsonRows(2)
    rows.text("[")
    rows.number(np.array([3, -40]))
    rows.text("]")
    assert rows.render(", ") == b"[3], [-40]"


def test_strings_with_a_nul_byte_are_refused():
    with pytest.raises(ValueError, match="NUL byte"):
        StringTable(["ok", "bad\0"])


@pytest.fixture(scope="module")
def renderer():
    from opscope.export.json_rows import RENDERER
    module = RENDERER.load()
    if module is None:
        pytest.skip(f"the C row renderer did not build: {RENDERER.failure_reason()}")
    return module


def random_layout(rng, n: int) -> JsonRows:
    """A layout of every kind of field, present everywhere, nowhere or on some rows."""
    rows = JsonRows(n)
    strings = StringTable(['"%s"' % ("x" * int(k)) for k in rng.integers(0, 70, 5)]
                          + ['"\\u00e9t\\u00e9"'])
    for k in range(int(rng.integers(3, 12))):
        present = [None, rng.random(n) < 0.5, np.zeros(n, bool), np.ones(n, bool)][k % 4]
        kind = rng.integers(0, 3)
        if kind == 0:
            rows.text("t%d" % k * int(rng.integers(0, 9)), present)
        elif kind == 1:
            values = (rng.random(n) * 10 ** rng.integers(0, 19, n)).astype(np.int64)
            values *= rng.choice([-1, 1], n)
            values[:2] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max][:min(2, n)]
            rows.number(values, micros=bool(rng.integers(0, 2)), present=present)
        else:
            rows.choice(strings, rng.integers(-1, len(strings), n), present)
    rows.text("}")
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_c_renderer_writes_the_same_bytes_as_numpy(renderer, seed):
    def layout() -> JsonRows:  # numpy's chunks() adds the separator to the layout
        rng = np.random.default_rng(seed)
        return random_layout(rng, int(rng.integers(1, 3000)))

    numpy_text = b",\n".join(bytes(c) for c in layout().chunks(",\n", rows_per_chunk=97))
    for per_chunk in (0, 1, 500):
        chunks = layout().native_chunks(renderer, ",\n", per_chunk)
        assert b",\n".join(bytes(c) for c in chunks) == numpy_text


def test_c_renderer_grows_its_buffer_for_wide_rows(renderer, monkeypatch):
    import opscope.export.json_rows as json_rows
    monkeypatch.setattr(json_rows, "NATIVE_CHUNK_BYTES", 16)  # less than one row
    rows = JsonRows(3)
    rows.text('{"name": "%s", "ts": ' % ("n" * 40))
    rows.number(np.array([1, 22, 333]), micros=True)
    rows.text("}")
    chunks = [bytes(c) for c in rows.native_chunks(renderer, ",\n")]
    assert b",\n".join(chunks) == rows.render(",\n")


def test_c_renderer_refuses_arrays_shorter_than_the_rows(renderer):
    short = np.zeros(2, dtype=np.int64)
    with pytest.raises(ValueError, match="values has 16 bytes"):
        renderer.render([(1, None, short, False)], 0, 3, b"", bytearray(100))
    table = StringTable(['"a"'])
    bad_offsets = np.array([0, 99, 3], dtype=np.int64)
    with pytest.raises(ValueError, match="offsets must rise within the blob"):
        renderer.render([(2, None, np.zeros(3, np.intp), table.blob, bad_offsets)], 0, 3,
                        b"", bytearray(100))
    with pytest.raises(ValueError, match="unknown field kind"):
        renderer.render([(7, None, b"x")], 0, 1, b"", bytearray(100))


def test_large_layouts_use_the_c_renderer(renderer, monkeypatch):
    import opscope.export.json_rows as json_rows
    calls = []
    monkeypatch.setattr(json_rows.JsonRows, "native_chunks",
                        lambda self, *a: calls.append(a) or iter(()))
    rows = JsonRows(json_rows.NATIVE_MIN_ROWS)
    rows.text("x")
    list(rows.chunks(","))
    assert len(calls) == 1
    small = JsonRows(5)
    small.text("x")
    assert b"".join(small.chunks(",")) == b"x,x,x,x,x"
    assert len(calls) == 1
