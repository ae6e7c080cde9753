// opscope native observer: the frame walk. The calling thread's Python frames, read without
// the Python API; one layout per CPython version, each in its frames_cpython3XX.h.
// Part of observer.cpp's one translation unit (through stacks.h); also compiled alone
// by tests/test_stack_layouts.py, with Python.h only.

#pragma once

// OPSCOPE-FRAME-WALK-BEGIN

// What the walk needs from one frame. code == nullptr: not a Python frame
// (a C-stack shim); lasti < 0: the frame has not started running yet.
struct FrameView {
  PyCodeObject* code;
  int lasti;  // byte offset of the current instruction, as PyCode_Addr2Line takes it
};

#include "frames_cpython310.h"

// 3.11 to 3.13: _PyInterpreterFrame (Include/internal/pycore_frame.h), from
// tstate->cframe->current_frame (3.11, 3.12) or tstate->current_frame (3.13).
constexpr char kOwnedByGenerator = 1;
constexpr char kOwnedByCStack = 3;  // 3.12+: the shim frame at each C entry

// A frame has started once its instruction reached the code's first
// traceable one (CPython's _PyFrame_IsIncomplete); a generator's frame always
// has. units: the instruction's index in code units. Returns its byte offset, or -1.
template <class Code>
int started_lasti(const PyObject* code_obj, int units, char owner) {
  auto* code = reinterpret_cast<const Code*>(code_obj);
  if (owner != kOwnedByGenerator && units < code->_co_firsttraceable) return -1;
  return units * 2;
}

// 3.11: the instruction pointer's index in code units, read from the frame.
template <class Code>
int units_from_first(const PyObject* code_obj, const void* instr) {
  auto* code = reinterpret_cast<const Code*>(code_obj);
  return int(static_cast<const uint16_t*>(instr) -
             reinterpret_cast<const uint16_t*>(code->co_code_adaptive));
}

// 3.12+: CPython's own public PyUnstable_InterpreterFrame_GetLasti (bytes), which
// reads and allocates nothing else. Called as interpreter_units<Code>(f) from a
// row's view, so that the name is looked up only in the row chosen (3.11 lacks it).
template <class Dependent, class IF = struct _PyInterpreterFrame, class F>
int interpreter_units(const F* f) {
  return PyUnstable_InterpreterFrame_GetLasti(reinterpret_cast<IF*>(const_cast<F*>(f))) / 2;
}

#include "frames_cpython311.h"
#include "frames_cpython312.h"
#include "frames_cpython313.h"

// The first row whose [kFirst, kEnd) holds the Python built against; void if none.
template <class... Rows> struct PickLayout { using type = void; };
template <class Row, class... Rows> struct PickLayout<Row, Rows...> {
  using type = typename std::conditional<(PY_VERSION_HEX >= Row::kFirst && PY_VERSION_HEX < Row::kEnd),
                                         Row, typename PickLayout<Rows...>::type>::type;
};
using FrameLayouts = PickLayout<Layout310, Layout311, Layout312, Layout313>;

#ifdef Py_GIL_DISABLED
constexpr bool kFreeThreaded = true;  // frames and code objects differ there
#else
constexpr bool kFreeThreaded = false;
#endif
using FrameLayout = typename std::conditional<kFreeThreaded, void, FrameLayouts::type>::type;
constexpr bool kLayoutKnown = !std::is_void<FrameLayout>::value;

// The calling thread's frames, innermost first, into out[0, cap). Returns
// how many; 0 when the thread runs no Python or the layout is unknown.
template <class L>
int walk_frames_with(PyThreadState* tstate, FrameView* out, int cap) {
  int n = 0;
  for (auto* f = L::top(tstate); f != nullptr && n < cap; f = L::next(f)) {
    FrameView v = L::template view<PyCodeObject>(f);
    if (v.code != nullptr && v.lasti >= 0) out[n++] = v;
  }
  return n;
}
template <>
int walk_frames_with<void>(PyThreadState*, FrameView*, int) { return 0; }

int walk_frames(FrameView* out, int cap) {
  PyThreadState* tstate = PyGILState_GetThisThreadState();
  if (tstate == nullptr) return 0;
  return walk_frames_with<FrameLayout>(tstate, out, cap);
}
// OPSCOPE-FRAME-WALK-END
