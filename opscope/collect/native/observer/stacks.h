// opscope native observer: with_stack's Python stacks: captured at op entry by walking the
// thread's frames (frames.h), interned per thread, joined at stop (collect_stacks).
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

inline uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

// ---- Python stacks -------------------------------------------------------
// torch's Python bindings release the GIL before an op runs, so the observer
// cannot use the Python API. It reads the calling thread's own interpreter
// frames instead: while this thread is inside an op, its Python frames are
// suspended below it and no other thread touches them, and each frame holds
// its code object. Only immutable fields are read; nothing is allocated or
// reference-counted (so PyUnstable_InterpreterFrame_GetCode, which increfs,
// is not used).
//
// The frame layout differs per CPython minor version: FrameLayouts (frames.h) is
// the table, one row per layout, each row in a file of its own
// (frames_cpython310.h ...). Adding a version is adding one file and its row. A row's
// members that name version-specific fields (tstate->frame, ->cframe,
// co_code_adaptive...) are templates, so they compile only for the row
// chosen for the Python being built against.
// (tests/test_stack_layouts.py compiles frames.h's region between the
// OPSCOPE-FRAME-WALK markers alone against each installed CPython.)

#include "frames.h"

// OPSCOPE_NO_FRAME_WALK=1 turns stacks off as on an unknown layout (what
// tests use to check the warning), read at each start().
bool g_frame_walk_on = kLayoutKnown;

bool frame_walk_supported() {
  return kLayoutKnown && std::getenv("OPSCOPE_NO_FRAME_WALK") == nullptr;
}

// Text of a str object, read without the GIL: compact strings only (all
// identifiers and almost every path); anything else gives "?".
std::string unicode_text(PyObject* o) {
  if (o == nullptr || !PyUnicode_Check(o) || !PyUnicode_IS_READY(o) || !PyUnicode_IS_COMPACT(o)) {
    return "?";
  }
  Py_ssize_t n = PyUnicode_GET_LENGTH(o);
  int kind = PyUnicode_KIND(o);
  const void* data = PyUnicode_DATA(o);
  if (kind == PyUnicode_1BYTE_KIND && PyUnicode_IS_ASCII(o)) {
    return std::string(static_cast<const char*>(data), size_t(n));
  }
  std::string out;
  for (Py_ssize_t i = 0; i < n; ++i) {
    uint32_t c = PyUnicode_READ(kind, data, i);
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xC0 | (c >> 6));
      out += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += char(0xE0 | (c >> 12));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    } else {
      out += char(0xF0 | (c >> 18));
      out += char(0x80 | ((c >> 12) & 0x3F));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    }
  }
  return out;
}

// The Python stack of the calling thread, interned in its buffer: kNoStack
// when the thread runs no Python (autograd workers, pool threads).
uint32_t capture_stack(ThreadBuffer& buf) {
  if (!g_frame_walk_on) return kNoStack;
  FrameView views[kMaxStackDepth];
  int n = walk_frames(views, kMaxStackDepth);
  FrameKey keys[kMaxStackDepth];
  uint64_t h = 1469598103934665603ULL;
  for (int i = 0; i < n; ++i) {
    PyCodeObject* code = views[i].code;
    keys[i] = FrameKey{code, views[i].lasti, code->co_filename, code->co_name};
    h = mix(mix(h, reinterpret_cast<uintptr_t>(code)), uint64_t(views[i].lasti));
  }
  if (n == 0) return kNoStack;
  auto& bucket = buf.stack_by_hash[h];
  for (uint32_t id : bucket) {
    uint32_t b = buf.stack_begin[id], e = buf.stack_begin[id + 1];
    if (int(e - b) != n) continue;
    bool same = true;
    for (int i = 0; i < n && same; ++i) same = buf.frame_keys[buf.stack_frames[b + i]] == keys[i];
    if (same) return id;
  }
  if (buf.stack_begin.empty()) buf.stack_begin.push_back(0);
  uint32_t id = uint32_t(buf.stack_begin.size() - 1);
  for (int i = 0; i < n; ++i) {
    auto it = buf.frame_ids.find(keys[i]);
    if (it == buf.frame_ids.end()) {
      // a new frame: copy its text out now, while the code object is alive
      it = buf.frame_ids.emplace(keys[i], uint32_t(buf.frame_keys.size())).first;
      buf.frame_keys.push_back(keys[i]);
      buf.frame_text.push_back(ResolvedFrame{unicode_text(keys[i].filename),
                                             PyCode_Addr2Line(keys[i].code, keys[i].lasti),
                                             unicode_text(keys[i].name)});
    }
    buf.stack_frames.push_back(it->second);
  }
  buf.stack_begin.push_back(uint32_t(buf.stack_frames.size()));
  bucket.push_back(id);
  return id;
}

// Appends the op's stack id (stack_ids holds one per record, in order). When
// memory runs out the thread records no more stacks this session, so the ids
// already there stay in step with their records.
void push_stack(ThreadState& ts, ThreadBuffer& buf) {
  try {
    uint32_t id = capture_stack(buf);
    buf.stack_ids.push_back(id);
  } catch (const std::bad_alloc&) {
    ts.with_stack = false;
    count_dropped();
  }
}

// Joins the per-thread stack tables into one. Returns (stack id per record,
// stack begin offsets, frame index per stack entry, frames as (filename,
// line, function)); ids and offsets are uint32 arrays as bytes.
py::tuple collect_stacks(const std::vector<ThreadBuffer*>& threads, size_t total) {
  std::vector<uint32_t> ids;
  ids.reserve(total);
  std::vector<uint32_t> begin{0}, entries;
  py::list frames;
  uint32_t frame_base = 0;
  for (ThreadBuffer* t : threads) {
    uint32_t base = uint32_t(begin.size() - 1);
    size_t n_records = t->count();
    for (size_t i = 0; i < n_records; ++i) {
      uint32_t id = i < t->stack_ids.size() ? t->stack_ids[i] : kNoStack;
      ids.push_back(id == kNoStack ? kNoStack : id + base);
    }
    size_t n_stacks = t->stack_begin.empty() ? 0 : t->stack_begin.size() - 1;
    for (size_t k = 0; k < n_stacks; ++k) {
      for (uint32_t f = t->stack_begin[k]; f < t->stack_begin[k + 1]; ++f) {
        entries.push_back(frame_base + t->stack_frames[f]);
      }
      begin.push_back(uint32_t(entries.size()));
    }
    for (const ResolvedFrame& f : t->frame_text) {
      frames.append(py::make_tuple(py::str(f.filename), f.line, py::str(f.name)));
    }
    frame_base += uint32_t(t->frame_text.size());
    std::vector<uint32_t>().swap(t->stack_ids);
    std::vector<uint32_t>().swap(t->stack_begin);
    std::vector<uint32_t>().swap(t->stack_frames);
    std::vector<FrameKey>().swap(t->frame_keys);
    std::vector<ResolvedFrame>().swap(t->frame_text);
    t->frame_ids.clear();
    t->stack_by_hash.clear();
  }
  auto as_bytes = [](const std::vector<uint32_t>& v) {
    return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(uint32_t));
  };
  return py::make_tuple(as_bytes(ids), as_bytes(begin), as_bytes(entries), frames);
}
