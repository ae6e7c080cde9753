// opscope native observer: CPython 3.11's frame layout.
// Part of frames.h (the frame walk), which includes it after FrameView (and, from
// 3.11, the helpers the rows share); a row of FrameLayouts there.

#pragma once

// CPython 3.11: _PyInterpreterFrame from tstate->cframe->current_frame;
// prev_instr points at the last instruction run.
struct Layout311 {
  static constexpr long kFirst = 0x030B0000, kEnd = 0x030C0000;
  struct Frame {  // 3.11 _PyInterpreterFrame (head)
    PyObject* f_func;
    PyObject* f_globals;
    PyObject* f_builtins;
    PyObject* f_locals;
    PyCodeObject* f_code;
    PyObject* frame_obj;
    Frame* previous;
    void* prev_instr;
    int stacktop;
    bool is_entry;
    char owner;
  };
  template <class TS> static const Frame* top(TS* t) {
    return t->cframe == nullptr ? nullptr : reinterpret_cast<const Frame*>(t->cframe->current_frame);
  }
  static const Frame* next(const Frame* f) { return f->previous; }
  template <class Code> static FrameView view(const Frame* f) {
    PyObject* code = reinterpret_cast<PyObject*>(f->f_code);
    if (code == nullptr) return FrameView{nullptr, -1};
    int units = units_from_first<Code>(code, f->prev_instr);
    return FrameView{f->f_code, started_lasti<Code>(code, units, f->owner)};
  }
};
