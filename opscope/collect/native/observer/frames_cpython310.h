// opscope native observer: CPython 3.10's frame layout.
// Part of frames.h (the frame walk), which includes it after FrameView (and, from
// 3.11, the helpers the rows share); a row of FrameLayouts there.

#pragma once

// CPython 3.10: PyFrameObject objects linked by f_back; f_lasti counts code units.
struct Layout310 {
  static constexpr long kFirst = 0x030A0000, kEnd = 0x030B0000;
  struct Frame {  // head of 3.10's struct _frame (Include/cpython/frameobject.h)
    PyVarObject ob_base;
    Frame* f_back;
    PyCodeObject* f_code;
    PyObject* f_builtins;
    PyObject* f_globals;
    PyObject* f_locals;
    PyObject** f_valuestack;
    PyObject* f_trace;
    int f_stackdepth;
    char f_trace_lines;
    char f_trace_opcodes;
    PyObject* f_gen;
    int f_lasti;  // -1 until the first instruction runs
  };
  template <class TS> static const Frame* top(TS* t) {
    return reinterpret_cast<const Frame*>(t->frame);
  }
  static const Frame* next(const Frame* f) { return f->f_back; }
  template <class Code> static FrameView view(const Frame* f) {
    return FrameView{f->f_code, f->f_lasti < 0 ? -1 : f->f_lasti * 2};
  }
};
