// opscope's trace scanner: the plain op events of a batch of trace JSON, read in C.
//
// A CPython extension with no torch headers (load/trace_fast.py). A trace's events
// are mostly ops of one shape: {"ph": "X", "cat": "cpu_op", "name": ..., "pid": P,
// "tid": T, "ts": ..., "dur": ..., "args": {"External id": ..., "Sequence number": ...}}.
// Parsing each into a dict costs microseconds; this reads their fields straight into
// a row of numbers, and gives every other event (any other key in args, an escaped
// string, a value of another type, a key given twice) back as its byte span, which
// Python parses as it always did. So the result is exact: a row is "plain" only when
// reading it here gives what json gives.
//
// The batch must be JSON throughout: a comma-separated list of values, as between
// the brackets of ``traceEvents``. Anything json would refuse, or reads in a way this
// does not (NaN, Infinity, nesting deeper than 256), makes ``scan`` return None and
// Python parses the whole batch itself, with its own errors.
//
// Python API:
//   new() -> handle                a scanner: the strings it has seen keep their ids
//   scan(handle, batch: bytes) -> (rows: bytes, strings: list) or None
//     one Row per item of the batch (ROW_SIZE bytes each, see kRowFields below);
//     ``strings``: the strings first seen in this batch, whose ids follow the ones
//     before (ids count from 0 over the scanner's life)
//   free(handle)

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

// One item of the batch. Fields other than start, end and plain are meaningful only
// when plain is 1. Ids are -1 when the key is absent.
struct Row {
  double ts;
  double dur;        // 0 when absent
  int64_t pid;
  int64_t tid;
  int64_t seq;       // args "Sequence number"; -1 when absent
  int64_t fwd;       // args "Fwd thread id"; 0 when absent
  int64_t start;     // the item's bytes in the batch: [start, end)
  int64_t end;
  int32_t ph;        // string ids
  int32_t cat;
  int32_t name;
  uint8_t plain;
  uint8_t pad[3];
};
static_assert(sizeof(Row) == 80, "Row is read by numpy as an 80-byte record");

struct Scanner {
  std::deque<std::string> texts;  // the strings seen, in id order (stable addresses)
  std::unordered_map<std::string_view, int32_t> ids;  // keys view into texts
  int32_t next = 0;
  int32_t last[3] = {-1, -1, -1};  // the last id read for ph, cat and name
};

std::vector<Scanner*> g_scanners;

constexpr int kMaxDepth = 256;

struct Parser {
  const char* p;
  const char* end;
  bool ok = true;

  void space() {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) ++p;
  }
  bool fail() {
    ok = false;
    return false;
  }
  // A JSON string at p; its raw bytes (between the quotes) in out, escaped true when it
  // has a backslash (its value then differs from its bytes).
  bool string(std::string_view& out, bool& escaped) {
    if (p >= end || *p != '"') return fail();
    const char* s = ++p;
    escaped = false;
    while (p < end) {
      const unsigned char c = static_cast<unsigned char>(*p);
      if (c == '"') {
        out = std::string_view(s, static_cast<size_t>(p - s));
        ++p;
        return true;
      }
      if (c < 0x20) return fail();
      if (c == '\\') {
        escaped = true;
        if (++p >= end) return fail();
        const char e = *p;
        if (e == 'u') {
          for (int k = 1; k <= 4; ++k) {
            if (p + k >= end || !std::isxdigit(static_cast<unsigned char>(p[k]))) return fail();
          }
          p += 4;
        } else if (!std::strchr("\"\\/bfnrt", e) || e == '\0') {
          return fail();
        }
      }
      ++p;
    }
    return fail();
  }
  // A JSON number at p: its text in out, integral true when it has no fraction or exponent.
  bool number(std::string_view& out, bool& integral) {
    const char* s = p;
    if (p < end && *p == '-') ++p;
    if (p >= end) return fail();
    if (*p == '0') {
      ++p;
    } else if (*p >= '1' && *p <= '9') {
      while (p < end && *p >= '0' && *p <= '9') ++p;
    } else {
      return fail();
    }
    integral = true;
    if (p < end && *p == '.') {
      integral = false;
      ++p;
      if (p >= end || *p < '0' || *p > '9') return fail();
      while (p < end && *p >= '0' && *p <= '9') ++p;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
      integral = false;
      ++p;
      if (p < end && (*p == '+' || *p == '-')) ++p;
      if (p >= end || *p < '0' || *p > '9') return fail();
      while (p < end && *p >= '0' && *p <= '9') ++p;
    }
    out = std::string_view(s, static_cast<size_t>(p - s));
    return true;
  }
  bool literal(const char* word) {
    const size_t n = std::strlen(word);
    if (static_cast<size_t>(end - p) < n || std::memcmp(p, word, n) != 0) return fail();
    p += n;
    return true;
  }
  // Skips any JSON value (checked as json would).
  bool skip(int depth) {
    if (depth > kMaxDepth) return fail();
    space();
    if (p >= end) return fail();
    std::string_view text;
    bool flag;
    switch (*p) {
      case '"': return string(text, flag);
      case '{': {
        ++p;
        space();
        if (p < end && *p == '}') return ++p, true;
        for (;;) {
          space();
          if (!string(text, flag)) return false;
          space();
          if (p >= end || *p != ':') return fail();
          ++p;
          if (!skip(depth + 1)) return false;
          space();
          if (p < end && *p == ',') { ++p; continue; }
          if (p < end && *p == '}') return ++p, true;
          return fail();
        }
      }
      case '[': {
        ++p;
        space();
        if (p < end && *p == ']') return ++p, true;
        for (;;) {
          if (!skip(depth + 1)) return false;
          space();
          if (p < end && *p == ',') { ++p; continue; }
          if (p < end && *p == ']') return ++p, true;
          return fail();
        }
      }
      case 't': return literal("true");
      case 'f': return literal("false");
      case 'n': return literal("null");
      default: return number(text, flag);
    }
  }
};

// The integer of a JSON integer's text, when it fits int64.
bool as_int64(std::string_view text, int64_t& out) {
  size_t k = 0;
  const bool negative = !text.empty() && text[0] == '-';
  if (negative) k = 1;
  if (text.size() - k > 18) {  // maybe past 64 bits: the library decides
    char buf[32];
    if (text.size() >= sizeof(buf)) return false;
    std::memcpy(buf, text.data(), text.size());
    buf[text.size()] = '\0';
    errno = 0;
    char* stop;
    const long long v = std::strtoll(buf, &stop, 10);
    if (errno != 0 || *stop != '\0') return false;
    out = v;
    return true;
  }
  int64_t v = 0;
  for (; k < text.size(); ++k) v = v * 10 + (text[k] - '0');
  out = negative ? -v : v;
  return true;
}

constexpr double kPowersOf10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
                                  1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
                                  1e20, 1e21, 1e22};

// The double of a JSON number's text, correctly rounded (as Python's float()). Digits
// d with a point and no exponent, d <= 2^53, are exact as (d / 10^k) for k <= 22: one
// correctly rounded division (Clinger's fast path; torch's "4956901857583.175" is one);
// anything else goes to strtod.
double as_double(std::string_view text) {
  uint64_t digits = 0;
  int count = 0, fraction = -1;
  bool simple = true;
  size_t k = (!text.empty() && text[0] == '-') ? 1 : 0;
  for (; k < text.size(); ++k) {
    const char c = text[k];
    if (c >= '0' && c <= '9') {
      digits = digits * 10 + static_cast<uint64_t>(c - '0');
      if (++count > 16) { simple = false; break; }  // 17 digits may pass 2^53
      if (fraction >= 0) ++fraction;
    } else if (c == '.') {
      fraction = 0;
    } else {
      simple = false;  // an exponent
      break;
    }
  }
  if (simple && digits <= (uint64_t{1} << 53)) {
    double v = static_cast<double>(digits);
    if (fraction > 0) v /= kPowersOf10[fraction];
    return text[0] == '-' ? -v : v;
  }
  char small[64];
  if (text.size() < sizeof(small)) {
    std::memcpy(small, text.data(), text.size());
    small[text.size()] = '\0';
    return std::strtod(small, nullptr);
  }
  std::string buf(text);
  return std::strtod(buf.c_str(), nullptr);
}

int32_t string_id(Scanner& s, std::string_view text, std::vector<std::string_view>& fresh) {
  auto it = s.ids.find(text);
  if (it != s.ids.end()) return it->second;
  const int32_t id = s.next++;
  s.texts.emplace_back(text);
  s.ids.emplace(std::string_view(s.texts.back()), id);
  fresh.push_back(text);
  return id;
}

// 0 ph, 1 cat, 2 name, 3 pid, 4 tid, 5 ts, 6 dur, 7 args; -1 any other key.
inline int event_key(std::string_view key) {
  switch (key.size()) {
    case 2: return key == "ph" ? 0 : key == "ts" ? 5 : -1;
    case 3: return key == "cat" ? 1 : key == "pid" ? 3 : key == "tid" ? 4
                 : key == "dur" ? 6 : -1;
    case 4: return key == "name" ? 2 : key == "args" ? 7 : -1;
    default: return -1;
  }
}

// Reads one item (the parser at its first byte) into row; false when the batch is not
// JSON as this reads it. A plain row is an object whose fields are all as described.
bool read_item(Parser& in, Scanner& s, Row& row, std::vector<std::string_view>& fresh) {
  std::memset(&row, 0, sizeof(row));
  row.ph = row.cat = row.name = -1;
  row.seq = -1;
  const char* start = in.p;
  row.start = 0;
  if (in.p >= in.end || *in.p != '{') {  // not an object: Python's to judge
    if (!in.skip(1)) return false;
    row.end = in.p - start;
    return true;
  }
  bool plain = true;
  unsigned seen = 0;  // a bit per key read, to notice a key given twice
  bool has_ts = false, has_pid = false, has_tid = false;
  ++in.p;
  in.space();
  if (in.p < in.end && *in.p == '}') {
    ++in.p;
    row.plain = 0;
    row.end = in.p - start;
    return true;
  }
  for (;;) {
    in.space();
    std::string_view key, text;
    bool escaped, flag;
    if (!in.string(key, escaped)) return false;
    in.space();
    if (in.p >= in.end || *in.p != ':') return in.fail();
    ++in.p;
    in.space();
    unsigned bit = 0;
    int which = -1;  // 0 ph, 1 cat, 2 name, 3 pid, 4 tid, 5 ts, 6 dur, 7 args
    if (!escaped) {
      which = event_key(key);
      if (which >= 0) bit = 1u << which;
    } else {
      plain = false;  // an escaped key may spell one of ours
    }
    if (which >= 0 && (seen & bit)) plain = false;
    seen |= bit;
    if (which >= 0 && which <= 2) {  // a string, unescaped
      if (in.p < in.end && *in.p == '"') {
        if (!in.string(text, escaped)) return false;
        if (escaped) plain = false;
        int32_t& last = s.last[which];  // most events repeat the one before
        const int32_t id = (last >= 0 && s.texts[static_cast<size_t>(last)] == text)
                               ? last : string_id(s, text, fresh);
        last = id;
        (which == 0 ? row.ph : which == 1 ? row.cat : row.name) = id;
      } else {
        plain = false;
        if (!in.skip(1)) return false;
      }
    } else if (which >= 3 && which <= 6) {  // a number
      const char c = in.p < in.end ? *in.p : '\0';
      if (c == '-' || (c >= '0' && c <= '9')) {
        if (!in.number(text, flag)) return false;
        if (which <= 4) {
          int64_t v = 0;
          if (!flag || !as_int64(text, v)) plain = false;
          (which == 3 ? row.pid : row.tid) = v;
          (which == 3 ? has_pid : has_tid) = true;
        } else {
          (which == 5 ? row.ts : row.dur) = as_double(text);
          if (which == 5) has_ts = true;
        }
      } else {
        plain = false;
        if (!in.skip(1)) return false;
      }
    } else if (which == 7) {  // args: only the keys every plain op has
      if (in.p < in.end && *in.p == '{') {
        ++in.p;
        in.space();
        if (in.p < in.end && *in.p == '}') {
          ++in.p;
        } else {
          unsigned arg_seen = 0;
          for (;;) {
            in.space();
            if (!in.string(key, escaped)) return false;
            in.space();
            if (in.p >= in.end || *in.p != ':') return in.fail();
            ++in.p;
            in.space();
            int arg = -1;  // 0 Sequence number, 1 Fwd thread id, 2 ignored by the loader
            if (escaped) {
              plain = false;
            } else if (key == "Sequence number") {
              arg = 0;
            } else if (key == "Fwd thread id") {
              arg = 1;
            } else if (key == "External id" || key == "Record function id" ||
                       key == "Ev Idx") {
              arg = 2;
            } else {
              plain = false;
            }
            if (arg == 0 || arg == 1) {
              if (arg_seen & (1u << arg)) plain = false;
              arg_seen |= 1u << arg;
              const char c = in.p < in.end ? *in.p : '\0';
              int64_t v = 0;
              if (c == '-' || (c >= '0' && c <= '9')) {
                if (!in.number(text, flag)) return false;
                if (!flag || !as_int64(text, v)) plain = false;
              } else {
                plain = false;
                if (!in.skip(2)) return false;
              }
              (arg == 0 ? row.seq : row.fwd) = v;
            } else if (!in.skip(2)) {
              return false;
            }
            in.space();
            if (in.p < in.end && *in.p == ',') { ++in.p; continue; }
            if (in.p < in.end && *in.p == '}') { ++in.p; break; }
            return in.fail();
          }
        }
      } else {
        plain = false;
        if (!in.skip(1)) return false;
      }
    } else if (!in.skip(1)) {  // a key the loader does not read from an op
      return false;
    }
    in.space();
    if (in.p < in.end && *in.p == ',') { ++in.p; continue; }
    if (in.p < in.end && *in.p == '}') { ++in.p; break; }
    return in.fail();
  }
  row.plain = plain && row.ph >= 0 && row.cat >= 0 && row.name >= 0 && has_ts && has_pid &&
              has_tid;
  row.end = in.p - start;
  return true;
}

PyObject* py_new(PyObject*, PyObject*) {
  g_scanners.push_back(new Scanner());
  return PyLong_FromSsize_t(static_cast<Py_ssize_t>(g_scanners.size() - 1));
}

Scanner* scanner_of(Py_ssize_t handle) {
  if (handle < 0 || static_cast<size_t>(handle) >= g_scanners.size() ||
      g_scanners[static_cast<size_t>(handle)] == nullptr) {
    PyErr_SetString(PyExc_ValueError, "trace scan: no such scanner");
    return nullptr;
  }
  return g_scanners[static_cast<size_t>(handle)];
}

PyObject* py_free(PyObject*, PyObject* args) {
  Py_ssize_t handle;
  if (!PyArg_ParseTuple(args, "n", &handle)) return nullptr;
  Scanner* s = scanner_of(handle);
  if (s == nullptr) return nullptr;
  delete s;
  g_scanners[static_cast<size_t>(handle)] = nullptr;
  Py_RETURN_NONE;
}

PyObject* py_scan(PyObject*, PyObject* args) {
  Py_ssize_t handle;
  Py_buffer view;
  if (!PyArg_ParseTuple(args, "ny*", &handle, &view)) return nullptr;
  Scanner* s = scanner_of(handle);
  if (s == nullptr) {
    PyBuffer_Release(&view);
    return nullptr;
  }
  const char* base = static_cast<const char*>(view.buf);
  Parser in{base, base + view.len};
  std::vector<Row> rows;
  std::vector<std::string_view> fresh;
  const int32_t ids_before = s->next;
  bool ok = true;
  Py_BEGIN_ALLOW_THREADS
  in.space();
  while (in.p < in.end) {
    Row row;
    const char* at = in.p;
    if (!read_item(in, *s, row, fresh)) { ok = false; break; }
    row.start = at - base;
    row.end = in.p - base;
    rows.push_back(row);
    in.space();
    if (in.p < in.end) {
      if (*in.p != ',') { ok = false; break; }
      ++in.p;
      in.space();
      if (in.p >= in.end) { ok = false; break; }  // a trailing comma
    }
  }
  Py_END_ALLOW_THREADS
  PyObject* result = nullptr;
  if (!ok || !in.ok) {
    // forget the strings of this batch: Python reads it, and their ids must not leak
    for (const std::string_view& text : fresh) s->ids.erase(text);
    s->texts.resize(s->texts.size() - fresh.size());
    s->next = ids_before;
    s->last[0] = s->last[1] = s->last[2] = -1;
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
  }
  PyObject* strings = PyList_New(static_cast<Py_ssize_t>(fresh.size()));
  for (size_t k = 0; strings != nullptr && k < fresh.size(); ++k) {
    PyObject* text = PyUnicode_DecodeUTF8(fresh[k].data(),
                                          static_cast<Py_ssize_t>(fresh[k].size()), "strict");
    if (text == nullptr) {
      Py_CLEAR(strings);
      break;
    }
    PyList_SET_ITEM(strings, static_cast<Py_ssize_t>(k), text);
  }
  if (strings != nullptr) {
    PyObject* data = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(rows.data()),
                                               static_cast<Py_ssize_t>(rows.size() * sizeof(Row)));
    if (data != nullptr) result = Py_BuildValue("(NN)", data, strings);
    else Py_DECREF(strings);
  }
  PyBuffer_Release(&view);
  return result;
}

PyMethodDef kMethods[] = {
    {"new", py_new, METH_NOARGS, "new() -> handle: a scanner with its own string ids"},
    {"scan", py_scan, METH_VARARGS,
     "scan(handle, batch) -> (rows bytes, new strings) or None when Python must parse it"},
    {"free", py_free, METH_VARARGS, "free(handle): forget a scanner"},
    {nullptr, nullptr, 0, nullptr},
};

#define OPSCOPE_STR2(x) #x
#define OPSCOPE_STR(x) OPSCOPE_STR2(x)

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, OPSCOPE_STR(TORCH_EXTENSION_NAME),
                       "opscope's trace scanner", -1, kMethods};

}  // namespace

#define OPSCOPE_CAT2(a, b) a##b
#define OPSCOPE_CAT(a, b) OPSCOPE_CAT2(a, b)

PyMODINIT_FUNC OPSCOPE_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PyObject* m = PyModule_Create(&kModule);
  if (m != nullptr) PyModule_AddIntConstant(m, "ROW_SIZE", static_cast<long>(sizeof(Row)));
  return m;
}
