// opscope native observer: CPython 3.12's frame layout.
// Part of frames.h (the frame walk), which includes it after FrameView (and, from
// 3.11, the helpers the rows share); a row of FrameLayouts there.

#pragma once

// CPython 3.12: _PyInterpreterFrame from tstate->cframe->current_frame; a C-stack
// shim frame at each C entry.
struct Layout312 {
  static constexpr long kFirst = 0x030C0000, kEnd = 0x030D0000;
  struct Frame {  // 3.12 _PyInterpreterFrame (head)
    PyCodeObject* f_code;
    Frame* previous;
    PyObject* f_funcobj;
    PyObject* f_globals;
    PyObject* f_builtins;
    PyObject* f_locals;
    PyObject* frame_obj;
    void* prev_instr;
    int stacktop;
    uint16_t return_offset;
    char owner;
  };
  template <class TS> static const Frame* top(TS* t) {
    return t->cframe == nullptr ? nullptr : reinterpret_cast<const Frame*>(t->cframe->current_frame);
  }
  static const Frame* next(const Frame* f) { return f->previous; }
  template <class Code> static FrameView view(const Frame* f) {
    PyObject* code = reinterpret_cast<PyObject*>(f->f_code);
    if (f->owner == kOwnedByCStack || code == nullptr) return FrameView{nullptr, -1};
    return FrameView{f->f_code, started_lasti<Code>(code, interpreter_units<Code>(f), f->owner)};
  }
};
