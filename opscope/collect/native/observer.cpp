// opscope native observer: a global at::RecordFunction callback that writes
// fixed-size records into per-thread chunks. No Python object is created on
// the hot path; Python decodes the chunks once, at stop.
//
// Per op (bench/instructions.py counts it): on_start_fast finds the thread's
// state through torch's thread number, the op's name id through the schema
// reference the RecordFunction holds, writes the record and returns the
// context that lives beside it in its slot; it calls nothing. A name the
// RecordFunction holds (autograd's, a range's) is found by content in
// on_start_own_name; with record_shapes, on_start_fast<true> also encodes the
// inputs (encode_inputs). on_end stamps the end; torch's delete of the
// context marks the slot released. Anything else (a first sight, stacks,
// another clock) takes on_start_general.
//
// The code is in observer/, one header per job, included below in this one translation
// unit, so that the compiler inlines across them as it did when they were one file.
//
// Layout of one record (48 bytes), mirrored by opscope/model/records.py (RECORD_DTYPE):
//   int64 start_ns, int64 end_ns, int64 seq_nr,
//   int32 name_id, int32 thread_index, uint32 fwd_thread_id, uint32 rf_thread_id,
//   uint32 shape_offset, uint8 scope, uint8 flags, uint16 pad
// Not <torch/extension.h>: it brings in torch's whole C++ API, about half of a cold
// build's compile time; this file needs pybind11, the dispatcher and RecordFunction.
#include <pybind11/pybind11.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#if defined(__linux__)
#include <linux/membarrier.h>
#endif
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace py = pybind11;

namespace {

#include "observer/clock.h"
#include "observer/records.h"
#include "observer/threads.h"
#include "observer/names.h"
#include "observer/inputs.h"
#include "observer/stacks.h"
#include "observer/callbacks.h"
#include "observer/memory.h"
#include "observer/session.h"
#include "observer/fork.h"
#include "observer/fatal.h"
#include "observer/ranges.h"

}  // namespace

// Calls fn() once. bench/instructions.py counts instructions under callgrind
// with --toggle-collect=opscope_measured_region: only what runs inside this
// call is counted (an unmangled, never-inlined symbol for that purpose).
extern "C" __attribute__((noinline, visibility("default"))) PyObject* opscope_measured_region(
    PyObject* fn) {
  return PyObject_CallNoArgs(fn);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pthread_atfork(nullptr, nullptr, &after_fork_in_child);
  m.def("start", &start, py::arg("record_shapes"), py::arg("profile_memory") = false,
        py::arg("with_stack") = false, "Start recording RecordFunction events");
  m.def("stop", &stop, "Stop recording and return the raw session");
  m.def("is_recording", &is_recording);
  m.def("held_record_bytes", &held_record_bytes,
        "Bytes of record chunks still held (call while not recording)");
  m.def("pooled_region_bytes", [] { return int64_t(g_regions.pooled_bytes()); },
        "Bytes of stopped sessions' regions kept for the next session");
  m.attr("region_bytes") = int64_t(kRegionBytes);
  m.def("install_fatal", &install_fatal, py::arg("prefix"), py::arg("epoch_offset_ns"),
        py::arg("start_ns"),
        "The black box's fatal dump: SIGSEGV/SIGBUS/SIGFPE/SIGABRT write the ring raw to "
        "prefix + unix ms + '.raw', then the signal goes on as before");
  m.def("uninstall_fatal", &uninstall_fatal);
  m.def("set_fatal_windows", &set_fatal_windows, py::arg("windows"), py::arg("live_start_ns"),
        "The finished windows (records, tids, start_ns, stop_ns) a fatal dump writes");
  m.def("regions_taken", [] { return int64_t(g_regions.taken()); },
        "Regions of region_bytes taken for records and inputs since load (any thread, any "
        "time; a count, never a lock)");
  m.def("dropped_records", [] { return int64_t(g_dropped.load(std::memory_order_relaxed)); },
        "Records, inputs, stacks and allocator reports left out for want of memory "
        "(inputs also when torch cannot describe one), since load");
  m.attr("pooled_regions_max") = int64_t(RegionPool::kPooledRegions);
  m.def("now_ns", &now_ns, "CLOCK_MONOTONIC in ns, the clock of all records");
  m.def("range_push", &range_push, py::arg("name"), py::arg("user_scope") = true);
  m.def("range_pop", &range_pop);
  m.def("empty_observer_start", &empty_observer_start, py::arg("needs_inputs") = false,
        "Register a do-nothing global callback (benchmarks: RecordFunction's own cost)");
  m.def("empty_observer_stop", &empty_observer_stop);
  m.def("measured_region", [](py::object fn) {
    PyObject* out = opscope_measured_region(fn.ptr());
    if (out == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(out);
  }, "Call fn() inside the symbol that bench/instructions.py counts under callgrind");
  m.attr("RECORD_SIZE") = int(sizeof(Record));
  m.attr("MEMORY_RECORD_SIZE") = int(sizeof(MemRecord));
  m.def("fast_path_state", [] {
    py::dict d;
    d["tsc"] = g_use_tsc;
    d["own_name_offset"] = int64_t(g_own_name_offset);
    d["async_offset"] = int64_t(g_async_offset);
    d["variant_index_confirmed"] =
        g_variant_index_checks.load(std::memory_order_relaxed) == kIndexConfirmed;
    d["light_fence"] = g_membarrier_state == 1;
    return d;
  }, "What on_start_fast relies on, as found on this torch: the TSC clock, the two offsets "
     "into at::RecordFunction (-1: not found, then every op takes on_start_general), "
     "whether names have confirmed the variant index (own-name ops take the fast path), and "
     "whether stop() fences for it with membarrier (else each op fences; known after a start)");
  m.def("frame_walk_supported", &frame_walk_supported,
        "True when with_stack can read Python frames on this Python (its frame "
        "layout is in FrameLayouts, and OPSCOPE_NO_FRAME_WALK is unset)");
}
