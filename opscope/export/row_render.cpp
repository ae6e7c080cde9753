// opscope's row renderer: JSON lines of one layout, written in C (json_rows.py).
//
// A CPython extension with no torch headers. ``JsonRows`` (export/json_rows.py)
// describes a layout as fields: constant text, integers (or nanoseconds written
// as microseconds with three decimals) and strings picked per row from a table,
// each optionally present per row. Its numpy renderer lays the rows out in a byte
// matrix; this one writes the same bytes straight into the output, about ten
// times faster, with the GIL released. Both must give the same bytes: a test
// renders random layouts both ways (tests/test_json_rows.py).
//
// Python API:
//   render(fields, first, end, separator, out) -> (rows, length)
//     writes rows [first, first + rows) of the layout into the writable buffer
//     ``out`` (``length`` bytes), ``separator`` between them (not after the last):
//     as many rows of [first, end) as surely fit, at least one when ``out`` holds
//     a row of the widest values. Each field is a tuple:
//       (0, present, text)                       bytes on every present row
//       (1, present, values, micros)             int64 values; micros: ns as us.nnn
//       (2, present, index, blob, offsets)       blob[offsets[i]:offsets[i + 1]] of
//                                                i = index[row] (intp) wrapped over the
//                                                len(offsets) - 1 strings, as numpy's
//                                                take(mode="wrap") does (the table's
//                                                last string is the empty one)
//     ``present`` is None or one bool byte per row. Every array must cover ``end``
//     rows, and offsets must lie in the blob; anything else raises ValueError.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

enum Kind { kText = 0, kNumber = 1, kChoice = 2 };

struct Field {
  int kind = kText;
  const uint8_t* present = nullptr;
  const char* text = nullptr;         // kText: the text; kChoice: the blob
  Py_ssize_t text_len = 0;
  const int64_t* values = nullptr;    // kNumber: values; kChoice: offsets
  Py_ssize_t values_len = 0;
  const Py_intptr_t* index = nullptr;  // kChoice
  bool micros = false;
  Py_ssize_t width = 0;               // the most bytes it writes on one row
};

// Buffers held for the duration of one call.
struct Buffers {
  std::vector<Py_buffer> held;
  ~Buffers() {
    for (Py_buffer& b : held) PyBuffer_Release(&b);
  }
  // The buffer of ``obj`` (C-contiguous), with at least ``items`` items of ``size`` bytes.
  const void* get(PyObject* obj, Py_ssize_t size, Py_ssize_t items, const char* what) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) != 0) return nullptr;
    held.push_back(view);
    if (view.len < size * items || (size > 1 && view.len % size != 0)) {
      PyErr_Format(PyExc_ValueError, "render: %s has %zd bytes, expected %zd items of %zd",
                   what, view.len, items, size);
      return nullptr;
    }
    return view.buf;
  }
};

const char kDigitPairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

// The number of decimal digits of ``x``.
inline int decimal_digits(uint64_t x) {
  int n = 1;
  for (;;) {
    if (x < 10) return n;
    if (x < 100) return n + 1;
    if (x < 1000) return n + 2;
    if (x < 10000) return n + 3;
    x /= 10000;
    n += 4;
  }
}

// ``x`` in decimal at ``out``, written from its last digit back; returns the end.
inline char* write_unsigned(char* out, uint64_t x) {
  char* const end = out + decimal_digits(x);
  char* p = end;
  while (x >= 100) {
    const unsigned k = static_cast<unsigned>(x % 100) * 2;
    x /= 100;
    *--p = kDigitPairs[k + 1];
    *--p = kDigitPairs[k];
  }
  if (x >= 10) {
    const unsigned k = static_cast<unsigned>(x) * 2;
    *--p = kDigitPairs[k + 1];
    *--p = kDigitPairs[k];
  } else {
    *--p = static_cast<char>('0' + x);
  }
  return end;
}

inline char* write_number(char* out, int64_t v, bool micros) {
  uint64_t x = static_cast<uint64_t>(v);
  if (v < 0) {
    *out++ = '-';
    x = ~x + 1;  // |v|, exact for the most negative value too
  }
  if (!micros) return write_unsigned(out, x);
  const uint64_t us = x / 1000;
  const unsigned frac = static_cast<unsigned>(x - us * 1000);
  out = write_unsigned(out, us);
  out[0] = '.';
  out[1] = static_cast<char>('0' + frac / 100);
  out[2] = kDigitPairs[(frac % 100) * 2];
  out[3] = kDigitPairs[(frac % 100) * 2 + 1];
  return out + 4;
}

// Reads one field tuple into ``f``; false with an exception set on bad input.
bool read_field(PyObject* tuple, Py_ssize_t end, Buffers& buffers, Field& f) {
  if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) < 3) {
    PyErr_SetString(PyExc_ValueError, "render: a field must be a tuple (kind, present, ...)");
    return false;
  }
  const Py_ssize_t size = PyTuple_GET_SIZE(tuple);
  f.kind = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(tuple, 0)));
  if (f.kind == -1 && PyErr_Occurred()) return false;
  PyObject* present = PyTuple_GET_ITEM(tuple, 1);
  if (present != Py_None) {
    f.present = static_cast<const uint8_t*>(buffers.get(present, 1, end, "present"));
    if (f.present == nullptr) return false;
  }
  PyObject* data = PyTuple_GET_ITEM(tuple, 2);
  if (f.kind == kText && size == 3) {
    char* text;
    if (PyBytes_AsStringAndSize(data, &text, &f.text_len) != 0) return false;
    f.text = text;
    f.width = f.text_len;
    return true;
  }
  if (f.kind == kNumber && size == 4) {
    f.values = static_cast<const int64_t*>(buffers.get(data, 8, end, "values"));
    const int micros = PyObject_IsTrue(PyTuple_GET_ITEM(tuple, 3));
    f.micros = micros == 1;
    f.width = 1 + 20 + (f.micros ? 4 : 0);
    return f.values != nullptr && micros >= 0;
  }
  if (f.kind == kChoice && size == 5) {
    f.index = static_cast<const Py_intptr_t*>(
        buffers.get(data, sizeof(Py_intptr_t), end, "index"));
    char* blob;
    if (f.index == nullptr ||
        PyBytes_AsStringAndSize(PyTuple_GET_ITEM(tuple, 3), &blob, &f.text_len) != 0) {
      return false;
    }
    f.text = blob;
    f.values = static_cast<const int64_t*>(
        buffers.get(PyTuple_GET_ITEM(tuple, 4), 8, 2, "offsets"));
    if (f.values == nullptr) return false;
    f.values_len = buffers.held.back().len / 8 - 1;  // the strings, the empty one too
    for (Py_ssize_t k = 0; k <= f.values_len; ++k) {
      const int64_t at = f.values[k];
      if (at < 0 || at > f.text_len || (k && at < f.values[k - 1])) {
        PyErr_SetString(PyExc_ValueError, "render: offsets must rise within the blob");
        return false;
      }
      if (k) f.width = std::max<Py_ssize_t>(f.width, at - f.values[k - 1]);
    }
    return true;
  }
  PyErr_SetString(PyExc_ValueError, "render: unknown field kind or size");
  return false;
}

// Copies n bytes (n < 64 in the usual rows) with a few unaligned moves; long ones by memcpy.
inline char* copy_small(char* out, const char* from, size_t n) {
  if (n <= 16) {
    if (n >= 8) {
      uint64_t a, b;
      std::memcpy(&a, from, 8);
      std::memcpy(&b, from + n - 8, 8);
      std::memcpy(out, &a, 8);
      std::memcpy(out + n - 8, &b, 8);
    } else if (n >= 4) {
      uint32_t a, b;
      std::memcpy(&a, from, 4);
      std::memcpy(&b, from + n - 4, 4);
      std::memcpy(out, &a, 4);
      std::memcpy(out + n - 4, &b, 4);
    } else {
      for (size_t k = 0; k < n; ++k) out[k] = from[k];
    }
    return out + n;
  }
  if (n <= 32) {
    char a[16], b[16];
    std::memcpy(a, from, 16);
    std::memcpy(b, from + n - 16, 16);
    std::memcpy(out, a, 16);
    std::memcpy(out + n - 16, b, 16);
    return out + n;
  }
  std::memcpy(out, from, n);
  return out + n;
}

PyObject* py_render(PyObject*, PyObject* args) {
  PyObject* fields_obj;
  PyObject* out_obj;
  Py_ssize_t first, end;
  const char* sep;
  Py_ssize_t sep_len;
  if (!PyArg_ParseTuple(args, "Onny#O", &fields_obj, &first, &end, &sep, &sep_len,
                        &out_obj)) {
    return nullptr;
  }
  if (first < 0 || end < first) {
    PyErr_SetString(PyExc_ValueError, "render: expected 0 <= first <= end");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(fields_obj, "render: fields must be a sequence");
  if (seq == nullptr) return nullptr;
  Buffers buffers;
  std::vector<Field> fields(static_cast<size_t>(PySequence_Fast_GET_SIZE(seq)));
  Py_ssize_t width = sep_len;  // the most one row can take
  for (size_t k = 0; k < fields.size(); ++k) {
    if (!read_field(PySequence_Fast_GET_ITEM(seq, k), end, buffers, fields[k])) {
      Py_DECREF(seq);
      return nullptr;
    }
    width += fields[k].width;
  }
  Py_DECREF(seq);
  Py_buffer out_view;
  if (PyObject_GetBuffer(out_obj, &out_view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
    return nullptr;
  }
  buffers.held.push_back(out_view);
  char* const start = static_cast<char*>(out_view.buf);
  char* const limit = start + out_view.len - width;  // a row that starts here fits
  char* p = start;
  Py_ssize_t row = first;
  Py_BEGIN_ALLOW_THREADS
  for (; row < end && p <= limit; ++row) {
    if (row != first) p = copy_small(p, sep, static_cast<size_t>(sep_len));
    for (const Field& f : fields) {
      if (f.present != nullptr && !f.present[row]) continue;
      if (f.kind == kText) {
        p = copy_small(p, f.text, static_cast<size_t>(f.text_len));
      } else if (f.kind == kNumber) {
        p = write_number(p, f.values[row], f.micros);
      } else {
        Py_ssize_t i = f.index[row] % f.values_len;  // wrap: -1 is the empty last string
        if (i < 0) i += f.values_len;
        const int64_t a = f.values[i], b = f.values[i + 1];
        p = copy_small(p, f.text + a, static_cast<size_t>(b - a));
      }
    }
  }
  Py_END_ALLOW_THREADS
  return Py_BuildValue("nn", row - first, static_cast<Py_ssize_t>(p - start));
}

PyMethodDef kMethods[] = {
    {"render", py_render, METH_VARARGS,
     "render(fields, first, end, separator, out) -> (rows, length) written into out"},
    {nullptr, nullptr, 0, nullptr},
};

#define OPSCOPE_STR2(x) #x
#define OPSCOPE_STR(x) OPSCOPE_STR2(x)

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, OPSCOPE_STR(TORCH_EXTENSION_NAME),
                       "opscope's JSON row renderer", -1, kMethods};

}  // namespace

#define OPSCOPE_CAT2(a, b) a##b
#define OPSCOPE_CAT(a, b) OPSCOPE_CAT2(a, b)

PyMODINIT_FUNC OPSCOPE_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  return PyModule_Create(&kModule);
}
