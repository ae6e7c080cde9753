// opscope native observer: CPython 3.13's frame layout.
// Part of frames.h (the frame walk), which includes it after FrameView (and, from
// 3.11, the helpers the rows share); a row of FrameLayouts there.

#pragma once

// CPython 3.13: _PyInterpreterFrame from tstate->current_frame; f_executable is
// the code object (None in a C-stack shim).
struct Layout313 {
  static constexpr long kFirst = 0x030D0000, kEnd = 0x030E0000;
  struct Frame {  // 3.13 _PyInterpreterFrame (head)
    PyObject* f_executable;  // the code object, or None in a C-stack shim
    Frame* previous;
    PyObject* f_funcobj;
    PyObject* f_globals;
    PyObject* f_builtins;
    PyObject* f_locals;
    PyObject* frame_obj;
    void* instr_ptr;  // the instruction executing now
    int stacktop;
    uint16_t return_offset;
    char owner;
  };
  template <class TS> static const Frame* top(TS* t) {
    return reinterpret_cast<const Frame*>(t->current_frame);
  }
  static const Frame* next(const Frame* f) { return f->previous; }
  template <class Code> static FrameView view(const Frame* f) {
    PyObject* code = f->f_executable;
    if (f->owner == kOwnedByCStack || code == nullptr || !PyCode_Check(code)) {
      return FrameView{nullptr, -1};
    }
    return FrameView{reinterpret_cast<PyCodeObject*>(code),
                     started_lasti<Code>(code, interpreter_units<Code>(f), f->owner)};
  }
};
