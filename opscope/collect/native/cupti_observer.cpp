// opscope's device collector: CUPTI's Activity API, decoded off the hot path.
//
// A CPython extension with no torch headers. It dlopens the libcupti that the
// Python side chose (the one torch loaded, so that Kineto and opscope share
// CUPTI's single state), enables the activity kinds of one session, and takes
// CUPTI's buffers in its completion callback, which runs on CUPTI's own thread:
// each record is decoded there into a fixed 104-byte DeviceRecord, so the
// launching threads pay nothing beyond what CUPTI itself costs.
//
// Python API (see opscope/collect/native/cupti.py; record_bytes and decode_buffer are
// for tests on machines with no GPU):
//   load(path)                 dlopen libcupti; raises with the reason
//   start()                    register the buffer callbacks, enable the kinds
//   stop()                     disable the kinds, flush every buffer
//   take() -> (bytes, names, dropped)  the records since the last take
//   clock_pair() -> (cupti_ns, monotonic_ns)  one calibration sample
//   RECORD_SIZE                the size of a DeviceRecord
//
// The struct names of the records come from the build (-DOPSCOPE_KERNEL_T ...),
// read from the cupti_activity.h the build found, so the layout is the
// header's own; the fields read here exist in every version since CUDA 11.

#include <Python.h>

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#ifndef OPSCOPE_KERNEL_T
#define OPSCOPE_KERNEL_T CUpti_ActivityKernel9
#endif
#ifndef OPSCOPE_MEMCPY_T
#define OPSCOPE_MEMCPY_T CUpti_ActivityMemcpy5
#endif
#ifndef OPSCOPE_MEMSET_T
#define OPSCOPE_MEMSET_T CUpti_ActivityMemset4
#endif

namespace {

// The record kinds, as opscope/model/device.py names them.
enum : uint8_t {
  KIND_KERNEL = 1, KIND_MEMCPY = 2, KIND_MEMSET = 3, KIND_RUNTIME = 4, KIND_DRIVER = 5,
  KIND_SYNC = 6,
};

#pragma pack(push, 8)
struct DeviceRecord {
  int64_t start_ns;       // CUPTI's clock; cupti.py moves it onto the collector's
  int64_t end_ns;
  int64_t bytes;          // memcpy, memset
  uint64_t graph_node;    // kernels, copies of a CUDA graph: the node id (0: none)
  uint32_t correlation;
  uint32_t thread;        // runtime, driver, sync: CUPTI's thread id
  uint32_t stream;
  uint32_t context;
  int32_t name_id;        // kernel: demangled name; runtime/driver: API name; else -1
  int32_t device;
  int32_t grid[3];
  int32_t block[3];
  int32_t shared_static;
  int32_t shared_dynamic;
  uint32_t graph_id;
  uint16_t registers;
  uint8_t kind;
  uint8_t copy_kind;      // memcpy: CUpti_ActivityMemcpyKind; sync: the sync type
  uint8_t src_kind;       // memcpy: CUpti_ActivityMemoryKind; memset: memoryKind
  uint8_t dst_kind;
  uint8_t pad[6];
};
#pragma pack(pop)
static_assert(sizeof(DeviceRecord) == 104, "DeviceRecord must stay 104 bytes (model/device.py)");

// CUPTI's entry points, resolved from the library Python chose.
struct Api {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetTimestamp) timestamp = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  decltype(&cuptiGetCallbackName) callback_name = nullptr;
};

Api g_api;
void* g_lib = nullptr;
std::mutex g_mutex;                      // guards everything below
std::vector<DeviceRecord> g_records;
std::vector<std::string> g_names;
std::unordered_map<std::string, int32_t> g_name_ids;
std::unordered_map<const char*, int32_t> g_kernel_ids;   // CUPTI's name pointers
std::unordered_map<uint64_t, int32_t> g_api_ids;         // (domain << 32 | cbid)
uint64_t g_dropped = 0;
std::atomic<bool> g_collecting{false};
constexpr size_t kBufferBytes = 4 << 20;
// 4M records (416 MiB) unread: a runaway window; records past it are counted and dropped
constexpr size_t kMaxRecords = 4u << 20;

int32_t intern_locked(const std::string& name) {
  auto it = g_name_ids.find(name);
  if (it != g_name_ids.end()) return it->second;
  int32_t id = static_cast<int32_t>(g_names.size());
  g_names.push_back(name);
  g_name_ids.emplace(name, id);
  return id;
}

int32_t kernel_name_locked(const char* mangled) {
  if (mangled == nullptr) return intern_locked("<unnamed kernel>");
  auto it = g_kernel_ids.find(mangled);
  if (it != g_kernel_ids.end()) return it->second;
  int status = 0;
  char* plain = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  int32_t id = intern_locked(status == 0 && plain ? plain : mangled);
  std::free(plain);
  g_kernel_ids.emplace(mangled, id);
  return id;
}

int32_t api_name_locked(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  uint64_t key = (static_cast<uint64_t>(domain) << 32) | cbid;
  auto it = g_api_ids.find(key);
  if (it != g_api_ids.end()) return it->second;
  const char* name = nullptr;
  std::string text;
  if (g_api.callback_name && g_api.callback_name(domain, cbid, &name) == CUPTI_SUCCESS && name) {
    text = name;
  } else {
    text = (domain == CUPTI_CB_DOMAIN_DRIVER_API ? "cuda_driver_" : "cuda_runtime_") +
           std::to_string(cbid);
  }
  int32_t id = intern_locked(text);
  g_api_ids.emplace(key, id);
  return id;
}

// The fields every device-side record (kernel, memcpy, memset) has, under the same names.
template <typename T>
void device_fields(DeviceRecord& r, const T* a, uint8_t kind) {
  r.kind = kind;
  r.start_ns = static_cast<int64_t>(a->start);
  r.end_ns = static_cast<int64_t>(a->end);
  r.device = static_cast<int32_t>(a->deviceId);
  r.context = a->contextId;
  r.stream = a->streamId;
  r.correlation = a->correlationId;
  r.graph_node = a->graphNodeId;
  r.graph_id = a->graphId;
}

void decode_locked(const CUpti_Activity* raw) {
  DeviceRecord r;
  std::memset(&r, 0, sizeof r);
  r.name_id = -1;
  switch (raw->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      auto* k = reinterpret_cast<const OPSCOPE_KERNEL_T*>(raw);
      device_fields(r, k, KIND_KERNEL);
      r.grid[0] = k->gridX; r.grid[1] = k->gridY; r.grid[2] = k->gridZ;
      r.block[0] = k->blockX; r.block[1] = k->blockY; r.block[2] = k->blockZ;
      r.shared_static = k->staticSharedMemory;
      r.shared_dynamic = k->dynamicSharedMemory;
      r.registers = k->registersPerThread;
      r.name_id = kernel_name_locked(k->name);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      auto* m = reinterpret_cast<const OPSCOPE_MEMCPY_T*>(raw);
      device_fields(r, m, KIND_MEMCPY);
      r.bytes = static_cast<int64_t>(m->bytes);
      r.copy_kind = m->copyKind;
      r.src_kind = m->srcKind;
      r.dst_kind = m->dstKind;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      auto* m = reinterpret_cast<const OPSCOPE_MEMSET_T*>(raw);
      device_fields(r, m, KIND_MEMSET);
      r.bytes = static_cast<int64_t>(m->bytes);
      r.src_kind = static_cast<uint8_t>(m->memoryKind);
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(raw);
      bool driver = raw->kind == CUPTI_ACTIVITY_KIND_DRIVER;
      r.kind = driver ? KIND_DRIVER : KIND_RUNTIME;
      r.start_ns = static_cast<int64_t>(a->start);
      r.end_ns = static_cast<int64_t>(a->end);
      r.thread = a->threadId;
      r.correlation = a->correlationId;
      r.device = -1;
      r.name_id = api_name_locked(driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API,
                                  a->cbid);
      break;
    }
    default:
      return;  // a kind this collector did not ask for
  }
  if (g_records.size() >= kMaxRecords) {
    ++g_dropped;
    return;
  }
  g_records.push_back(r);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  if (buffer == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* record = nullptr;
    while (valid > 0 && g_api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      decode_locked(record);
    }
  }
  std::free(buffer);
}

const CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
};

PyObject* cupti_error(const char* what, CUptiResult rc) {
  const char* text = nullptr;
  if (g_api.result_string) g_api.result_string(rc, &text);
  PyErr_Format(PyExc_RuntimeError, "%s failed: %s (CUPTI error %d)", what,
               text ? text : "unknown error", static_cast<int>(rc));
  return nullptr;
}

template <typename F>
bool resolve(F& slot, const char* name) {
  slot = reinterpret_cast<F>(dlsym(g_lib, name));
  return slot != nullptr;
}

PyObject* py_load(PyObject*, PyObject* args) {
  const char* path = nullptr;
  if (!PyArg_ParseTuple(args, "s", &path)) return nullptr;
  if (g_lib != nullptr) Py_RETURN_NONE;
  void* lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    PyErr_Format(PyExc_RuntimeError, "cannot load %s: %s", path, dlerror());
    return nullptr;
  }
  g_lib = lib;
  bool ok = resolve(g_api.register_callbacks, "cuptiActivityRegisterCallbacks") &&
            resolve(g_api.enable, "cuptiActivityEnable") &&
            resolve(g_api.disable, "cuptiActivityDisable") &&
            resolve(g_api.flush_all, "cuptiActivityFlushAll") &&
            resolve(g_api.next_record, "cuptiActivityGetNextRecord") &&
            resolve(g_api.timestamp, "cuptiGetTimestamp") &&
            resolve(g_api.result_string, "cuptiGetResultString");
  resolve(g_api.callback_name, "cuptiGetCallbackName");  // optional: names fall back to ids
  if (!ok) {
    g_lib = nullptr;
    g_api = Api();
    PyErr_Format(PyExc_RuntimeError, "%s lacks the CUPTI Activity API", path);
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* py_start(PyObject*, PyObject*) {
  if (g_lib == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "libcupti is not loaded");
    return nullptr;
  }
  CUptiResult rc;
  Py_BEGIN_ALLOW_THREADS
  rc = g_api.register_callbacks(buffer_requested, buffer_completed);
  Py_END_ALLOW_THREADS
  if (rc != CUPTI_SUCCESS) return cupti_error("cuptiActivityRegisterCallbacks", rc);
  size_t enabled = 0;
  for (CUpti_ActivityKind kind : kKinds) {
    rc = g_api.enable(kind);
    if (rc != CUPTI_SUCCESS) {
      for (size_t i = 0; i < enabled; ++i) g_api.disable(kKinds[i]);
      return cupti_error("cuptiActivityEnable", rc);
    }
    ++enabled;
  }
  g_collecting = true;
  Py_RETURN_NONE;
}

PyObject* py_stop(PyObject*, PyObject*) {
  if (!g_collecting.exchange(false)) Py_RETURN_NONE;
  CUptiResult rc = CUPTI_SUCCESS;
  Py_BEGIN_ALLOW_THREADS
  for (CUpti_ActivityKind kind : kKinds) g_api.disable(kind);
  // forced: hand over partly filled buffers too, so the next session starts empty
  rc = g_api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  Py_END_ALLOW_THREADS
  if (rc != CUPTI_SUCCESS && rc != CUPTI_ERROR_QUEUE_EMPTY) return cupti_error("cuptiActivityFlushAll", rc);
  Py_RETURN_NONE;
}

PyObject* py_take(PyObject*, PyObject*) {
  std::vector<DeviceRecord> records;
  std::vector<std::string> names;
  uint64_t dropped;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    records.swap(g_records);
    names = g_names;  // ids stay valid across sessions: the table only grows
    dropped = g_dropped;
    g_dropped = 0;
  }
  PyObject* blob = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(records.data()),
                                             static_cast<Py_ssize_t>(records.size() * sizeof(DeviceRecord)));
  if (blob == nullptr) return nullptr;
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(names.size()));
  if (list == nullptr) { Py_DECREF(blob); return nullptr; }
  for (size_t i = 0; i < names.size(); ++i) {
    PyObject* s = PyUnicode_DecodeUTF8(names[i].data(), static_cast<Py_ssize_t>(names[i].size()), "replace");
    if (s == nullptr) { Py_DECREF(blob); Py_DECREF(list); return nullptr; }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), s);
  }
  return Py_BuildValue("(NNK)", blob, list, static_cast<unsigned long long>(dropped));
}

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

PyObject* py_clock_pair(PyObject*, PyObject*) {
  if (g_lib == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "libcupti is not loaded");
    return nullptr;
  }
  // the tightest of a few brackets: CUPTI's time against the middle of ours
  int64_t best_width = INT64_MAX, best_cupti = 0, best_mono = 0;
  for (int i = 0; i < 7; ++i) {
    uint64_t cupti = 0;
    int64_t before = monotonic_ns();
    CUptiResult rc = g_api.timestamp(&cupti);
    int64_t after = monotonic_ns();
    if (rc != CUPTI_SUCCESS) return cupti_error("cuptiGetTimestamp", rc);
    if (after - before < best_width) {
      best_width = after - before;
      best_cupti = static_cast<int64_t>(cupti);
      best_mono = before + (after - before) / 2;
    }
  }
  return Py_BuildValue("(LL)", static_cast<long long>(best_cupti), static_cast<long long>(best_mono));
}

PyObject* py_thread_key(PyObject*, PyObject*) {
  // what CUPTI writes as threadId for the calling thread
  return PyLong_FromUnsignedLong(static_cast<unsigned long>(
      static_cast<uint32_t>(reinterpret_cast<uintptr_t>(reinterpret_cast<void*>(pthread_self())))));
}

// -- for tests on machines without a GPU: records built from the header's own structs --

std::deque<std::string> g_test_names;  // kernel names the test records point to

// What device_fields reads, written into a test record.
template <typename T>
void set_device_fields(T& a, int kind, uint64_t start, uint64_t end, uint32_t correlation,
                       int device, uint32_t stream) {
  std::memset(&a, 0, sizeof a);
  a.kind = static_cast<CUpti_ActivityKind>(kind);
  a.start = start; a.end = end; a.correlationId = correlation;
  a.deviceId = static_cast<uint32_t>(device); a.streamId = stream; a.contextId = 1;
}

// record_bytes(kind, start, end, correlation, device, stream, thread, cbid, nbytes,
//              copy_kind, src_kind, dst_kind, name) -> the CUPTI record, byte for byte
PyObject* py_record_bytes(PyObject*, PyObject* args) {
  int kind, device, copy_kind, src_kind, dst_kind;
  unsigned long long start, end, nbytes;
  unsigned int correlation, stream, thread, cbid;
  const char* name;
  if (!PyArg_ParseTuple(args, "iKKIiIIIKiiis", &kind, &start, &end, &correlation, &device,
                        &stream, &thread, &cbid, &nbytes, &copy_kind, &src_kind, &dst_kind, &name))
    return nullptr;
  std::string out;
  if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || kind == CUPTI_ACTIVITY_KIND_KERNEL) {
    OPSCOPE_KERNEL_T k;
    set_device_fields(k, kind, start, end, correlation, device, stream);
    k.gridX = 4; k.gridY = 2; k.gridZ = 1; k.blockX = 128; k.blockY = 1; k.blockZ = 1;
    k.registersPerThread = 32; k.staticSharedMemory = 16; k.dynamicSharedMemory = 8;
    g_test_names.emplace_back(name);
    k.name = g_test_names.back().c_str();
    out.assign(reinterpret_cast<const char*>(&k), sizeof k);
  } else if (kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
    OPSCOPE_MEMCPY_T m;
    set_device_fields(m, kind, start, end, correlation, device, stream);
    m.bytes = nbytes;
    m.copyKind = static_cast<uint8_t>(copy_kind);
    m.srcKind = static_cast<uint8_t>(src_kind);
    m.dstKind = static_cast<uint8_t>(dst_kind);
    out.assign(reinterpret_cast<const char*>(&m), sizeof m);
  } else if (kind == CUPTI_ACTIVITY_KIND_MEMSET) {
    OPSCOPE_MEMSET_T m;
    set_device_fields(m, kind, start, end, correlation, device, stream);
    m.bytes = nbytes;
    m.memoryKind = static_cast<uint16_t>(src_kind);
    out.assign(reinterpret_cast<const char*>(&m), sizeof m);
  } else if (kind == CUPTI_ACTIVITY_KIND_RUNTIME || kind == CUPTI_ACTIVITY_KIND_DRIVER) {
    CUpti_ActivityAPI a;
    std::memset(&a, 0, sizeof a);
    a.kind = static_cast<CUpti_ActivityKind>(kind);
    a.start = start; a.end = end; a.correlationId = correlation;
    a.threadId = thread; a.cbid = cbid; a.processId = 1;
    out.assign(reinterpret_cast<const char*>(&a), sizeof a);
  } else {
    CUpti_Activity other;
    std::memset(&other, 0, sizeof other);
    other.kind = static_cast<CUpti_ActivityKind>(kind);
    out.assign(reinterpret_cast<const char*>(&other), sizeof other);
  }
  out.resize((out.size() + 7) / 8 * 8, '\0');  // records sit 8-byte aligned in a buffer
  return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}

size_t record_size(uint32_t kind) {
  size_t n;
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: n = sizeof(OPSCOPE_KERNEL_T); break;
    case CUPTI_ACTIVITY_KIND_MEMCPY: n = sizeof(OPSCOPE_MEMCPY_T); break;
    case CUPTI_ACTIVITY_KIND_MEMSET: n = sizeof(OPSCOPE_MEMSET_T); break;
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: n = sizeof(CUpti_ActivityAPI); break;
    default: n = sizeof(CUpti_Activity); break;
  }
  return (n + 7) / 8 * 8;
}

// decode_buffer(bytes): what buffer_completed does with a buffer CUPTI handed over
PyObject* py_decode_buffer(PyObject*, PyObject* args) {
  Py_buffer view;
  if (!PyArg_ParseTuple(args, "y*", &view)) return nullptr;
  std::vector<uint64_t> copy((static_cast<size_t>(view.len) + 7) / 8);
  std::memcpy(copy.data(), view.buf, static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  const uint8_t* base = reinterpret_cast<const uint8_t*>(copy.data());
  size_t len = copy.size() * 8, at = 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (at + sizeof(CUpti_Activity) <= len) {
    auto* record = reinterpret_cast<const CUpti_Activity*>(base + at);
    size_t size = record_size(record->kind);
    if (at + size > len) break;
    decode_locked(record);
    at += size;
  }
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"record_bytes", py_record_bytes, METH_VARARGS, "record_bytes(...) -> one CUPTI record (tests)"},
    {"decode_buffer", py_decode_buffer, METH_VARARGS, "decode_buffer(bytes): decode records (tests)"},
    {"load", py_load, METH_VARARGS, "load(path): dlopen libcupti and resolve the Activity API"},
    {"start", py_start, METH_NOARGS, "start(): register the buffer callbacks, enable the kinds"},
    {"stop", py_stop, METH_NOARGS, "stop(): disable the kinds and flush every buffer"},
    {"take", py_take, METH_NOARGS, "take() -> (records bytes, names, dropped records)"},
    {"clock_pair", py_clock_pair, METH_NOARGS, "clock_pair() -> (CUPTI ns, CLOCK_MONOTONIC ns)"},
    {"thread_key", py_thread_key, METH_NOARGS, "thread_key() -> CUPTI's id of this thread"},
    {nullptr, nullptr, 0, nullptr},
};

#define OPSCOPE_STR2(x) #x
#define OPSCOPE_STR(x) OPSCOPE_STR2(x)

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, OPSCOPE_STR(TORCH_EXTENSION_NAME),
                       "opscope's CUPTI device collector", -1, kMethods};

}  // namespace

#define OPSCOPE_CAT2(a, b) a##b
#define OPSCOPE_CAT(a, b) OPSCOPE_CAT2(a, b)

PyMODINIT_FUNC OPSCOPE_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PyObject* m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  PyModule_AddIntConstant(m, "RECORD_SIZE", static_cast<long>(sizeof(DeviceRecord)));
  // CUPTI's activity kinds, for tests that build records (record_bytes)
  PyModule_AddIntConstant(m, "CUPTI_KERNEL", CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  PyModule_AddIntConstant(m, "CUPTI_MEMCPY", CUPTI_ACTIVITY_KIND_MEMCPY);
  PyModule_AddIntConstant(m, "CUPTI_MEMSET", CUPTI_ACTIVITY_KIND_MEMSET);
  PyModule_AddIntConstant(m, "CUPTI_RUNTIME", CUPTI_ACTIVITY_KIND_RUNTIME);
  PyModule_AddIntConstant(m, "CUPTI_DRIVER", CUPTI_ACTIVITY_KIND_DRIVER);
  PyModule_AddIntConstant(m, "CUPTI_OVERHEAD", CUPTI_ACTIVITY_KIND_OVERHEAD);
  return m;
}
