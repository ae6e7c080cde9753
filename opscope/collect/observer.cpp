// opscope native observer: a global at::RecordFunction callback that writes
// fixed-size records into per-thread chunks. No Python object is created on
// the hot path; Python decodes the chunks once, at stop.
//
// Layout of one record (48 bytes), mirrored by opscope/collect/raw.py:
//   int64 start_ns, int64 end_ns, int64 seq_nr,
//   int32 name_id, int32 thread_index, uint32 fwd_thread_id, uint32 rf_thread_id,
//   uint32 shape_offset, uint8 scope, uint8 flags, uint16 pad
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace {

constexpr uint32_t kNoShapes = 0xFFFFFFFFu;
constexpr uint8_t kFlagUnfinished = 1;
constexpr uint8_t kFlagAsync = 2;
constexpr size_t kChunkRecords = 8192;

struct Record {
  int64_t start_ns;
  int64_t end_ns;
  int64_t seq_nr;
  int32_t name_id;
  int32_t thread_index;
  uint32_t fwd_thread_id;
  uint32_t rf_thread_id;
  uint32_t shape_offset;
  uint8_t scope;
  uint8_t flags;
  uint16_t pad;
};
static_assert(sizeof(Record) == 48, "Record layout must match raw.py");

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// Record timestamps come from the invariant TSC where the CPU has one (a few
// cycles to read), else CLOCK_MONOTONIC. stop() converts ticks to
// CLOCK_MONOTONIC ns with a line fitted between load time and stop time.
bool detect_invariant_tsc() {
#if defined(__x86_64__)
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (line.rfind("flags", 0) == 0) {
      return line.find(" constant_tsc") != std::string::npos &&
             line.find(" nonstop_tsc") != std::string::npos;
    }
  }
#endif
  return false;
}
const bool g_use_tsc = detect_invariant_tsc() && std::getenv("OPSCOPE_NO_TSC") == nullptr;

inline int64_t ticks() {
#if defined(__x86_64__)
  if (g_use_tsc) return int64_t(__rdtsc());
#endif
  return now_ns();
}

struct ClockPoint {
  int64_t ticks;
  int64_t ns;
};

ClockPoint clock_point() {
  // read the tick counter on both sides of the clock, keep the tightest pair
  ClockPoint best{0, 0};
  int64_t best_gap = INT64_MAX;
  for (int i = 0; i < 5; ++i) {
    int64_t a = ticks();
    int64_t ns = now_ns();
    int64_t b = ticks();
    if (b - a < best_gap) {
      best_gap = b - a;
      best = ClockPoint{a + (b - a) / 2, ns};
    }
  }
  return best;
}
const ClockPoint g_load_point = clock_point();

// Names are interned once per process; ids stay valid across sessions.
struct NameTable {
  std::mutex mu;
  std::unordered_map<std::string, int32_t> ids;
  std::deque<std::string> names;  // deque: references stay valid on growth

  const std::string* intern(const char* s, int32_t* id_out) {
    std::lock_guard<std::mutex> g(mu);
    auto it = ids.find(s);
    if (it != ids.end()) {
      *id_out = it->second;
      return &names[it->second];
    }
    int32_t id = int32_t(names.size());
    names.emplace_back(s);
    ids.emplace(names.back(), id);
    *id_out = id;
    return &names.back();
  }
};
NameTable g_names;

struct ThreadBuffer {
  int32_t index = 0;
  int64_t os_tid = 0;
  size_t used = 0;  // records used in the last chunk
  std::vector<std::unique_ptr<Record[]>> chunks;
  std::vector<int64_t> shapes;  // encoded inputs, see encode_inputs
  std::atomic<bool> busy{false};  // an on_start is writing; stop waits on it

  Record* next() {
    if (chunks.empty() || used == kChunkRecords) {
      chunks.emplace_back(new Record[kChunkRecords]);
      used = 0;
    }
    return &chunks.back()[used++];
  }
  size_t count() const {
    return chunks.empty() ? 0 : (chunks.size() - 1) * kChunkRecords + used;
  }
};

// Every ThreadBuffer ever made, so contexts can hold plain pointers: a buffer
// object (a few hundred bytes) is never freed, only its chunks are, once no
// record in them is still open (see stop()). Guarded by g_session_mu.
std::deque<std::unique_ptr<ThreadBuffer>> g_all_buffers;

struct Session {
  uint64_t generation = 0;
  bool record_shapes = false;
  std::mutex mu;
  std::vector<ThreadBuffer*> threads;

  ThreadBuffer* add_thread() {  // called with g_session_mu held
    std::lock_guard<std::mutex> g(mu);
    g_all_buffers.emplace_back(new ThreadBuffer());
    ThreadBuffer* buf = g_all_buffers.back().get();
    buf->index = int32_t(threads.size());
    buf->os_tid = int64_t(syscall(SYS_gettid));
    threads.push_back(buf);
    return buf;
  }
};

std::mutex g_session_mu;
std::shared_ptr<Session> g_session;  // guarded by g_session_mu
std::atomic<uint64_t> g_active_generation{0};  // 0: not recording
uint64_t g_last_generation = 0;
at::CallbackHandle g_handle = 0;

struct NameCacheSlot {
  const char* ptr = nullptr;
  const std::string* str = nullptr;
  int32_t id = -1;
};

struct ThreadState {
  uint64_t generation = 0;
  bool record_shapes = false;
  bool skip = false;  // an intra-op pool worker: torch.profiler never sees these
  ThreadBuffer* buffer = nullptr;
  NameCacheSlot cache[256];
  std::unordered_map<std::string, int32_t> by_content;
  // Contexts are recycled here instead of malloc'd; one freed on another
  // thread joins that thread's list, so lists only reach the open-range count.
  std::vector<void*> ctx_free;
  ~ThreadState();
};

// One trivially-initialised thread-local pointer: a single TLS lookup per
// callback (thread_locals with constructors cost a guard and more lookups).
thread_local ThreadState* t_state_ptr = nullptr;
thread_local std::unique_ptr<ThreadState> t_state_owner;

ThreadState::~ThreadState() {
  for (void* p : ctx_free) ::operator delete(p);
  t_state_ptr = nullptr;
}

inline ThreadState& thread_state() {
  ThreadState* s = t_state_ptr;
  if (__builtin_expect(s == nullptr, 0)) {
    t_state_owner.reset(new ThreadState());
    s = t_state_ptr = t_state_owner.get();
  }
  return *s;
}

int32_t name_id(ThreadState& ts, const char* name) {
  // Pointer-keyed cache, validated by content: a pointer reused for another
  // string misses, and a new pointer to a known string hits the content map.
  size_t slot = (reinterpret_cast<uintptr_t>(name) >> 4) & 255;
  NameCacheSlot& c = ts.cache[slot];
  if (c.ptr == name && std::strcmp(c.str->c_str(), name) == 0) {
    return c.id;
  }
  int32_t id;
  const std::string* str;
  auto it = ts.by_content.find(name);
  if (it != ts.by_content.end()) {
    id = it->second;
    std::lock_guard<std::mutex> g(g_names.mu);
    str = &g_names.names[id];
  } else {
    str = g_names.intern(name, &id);
    ts.by_content.emplace(*str, id);
  }
  c.ptr = name;
  c.str = str;
  c.id = id;
  return id;
}

// Input encoding, one entry per input, read by raw.py:decode_inputs.
//   0: none/other   1: tensor [ndim, sizes..., strides..., dtype]
//   2: int [value]  3: double [bits]  4: bool [value]
//   5: tensor list [count]  6: int list [count, values...]  7: string
void encode_inputs(const at::RecordFunction& fn, std::vector<int64_t>& out) {
  auto inputs = fn.inputs();
  out.push_back(int64_t(inputs.size()));
  for (const c10::IValue& v : inputs) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        out.push_back(0);
        continue;
      }
      out.push_back(1);
      int64_t nd = t.dim();
      out.push_back(nd);
      auto sizes = t.sizes();
      for (int64_t i = 0; i < nd; ++i) out.push_back(sizes[i]);
      if (t.layout() == at::kStrided) {
        auto strides = t.strides();
        for (int64_t i = 0; i < nd; ++i) out.push_back(strides[i]);
      } else {
        for (int64_t i = 0; i < nd; ++i) out.push_back(0);
      }
      out.push_back(int64_t(t.scalar_type()));
    } else if (v.isInt()) {
      out.push_back(2);
      out.push_back(v.toInt());
    } else if (v.isDouble()) {
      out.push_back(3);
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof(bits));
      out.push_back(bits);
    } else if (v.isBool()) {
      out.push_back(4);
      out.push_back(v.toBool() ? 1 : 0);
    } else if (v.isTensorList()) {
      out.push_back(5);
      out.push_back(int64_t(v.toTensorList().size()));
    } else if (v.isIntList()) {
      auto l = v.toIntList();
      out.push_back(6);
      out.push_back(int64_t(l.size()));
      for (int64_t x : l) out.push_back(x);
    } else if (v.isString()) {
      out.push_back(7);
    } else {
      out.push_back(0);
    }
  }
}

struct Ctx : public at::ObserverContext {
  // A late end (after stop, or on another thread) still writes into live
  // memory: stop() keeps every chunk that holds an open record.
  Record* rec;

  // Built with placement new on memory from ThreadState::ctx_free (on_start);
  // unique_ptr's delete lands here and recycles the memory.
  static void operator delete(void* p, size_t size) {
    if (size == sizeof(Ctx)) {
      thread_state().ctx_free.push_back(p);
    } else {
      ::operator delete(p);
    }
  }
};

bool join_session(ThreadState& ts, uint64_t gen) {
  std::lock_guard<std::mutex> g(g_session_mu);
  if (!g_session || g_session->generation != gen) return false;
  // Workers of at::parallel_for run ops only inside a parallel region, as a
  // non-master thread; the thread that opened the region is recorded.
  ts.skip = at::in_parallel_region() && at::get_thread_num() != 0;
  ts.generation = gen;
  if (ts.skip) {
    ts.buffer = nullptr;
    return false;
  }
  ts.buffer = g_session->add_thread();
  ts.record_shapes = g_session->record_shapes;
  return true;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  uint64_t gen = g_active_generation.load(std::memory_order_acquire);
  if (gen == 0) return nullptr;
  ThreadState& ts = thread_state();
  if (ts.generation != gen) {
    if (!join_session(ts, gen)) return nullptr;
  } else if (ts.skip) {
    return nullptr;
  }
  ThreadBuffer* buf = ts.buffer;
  // Dekker handshake with stop(): publish busy, then re-check the generation.
  buf->busy.store(true, std::memory_order_seq_cst);
  if (g_active_generation.load(std::memory_order_seq_cst) != gen) {
    buf->busy.store(false, std::memory_order_release);
    return nullptr;
  }
  Record* r = buf->next();
  r->name_id = name_id(ts, fn.name());
  r->thread_index = buf->index;
  r->seq_nr = fn.seqNr();
  r->fwd_thread_id = uint32_t(fn.forwardThreadId());
  r->rf_thread_id = uint32_t(fn.threadId());
  r->scope = uint8_t(fn.scope());
  r->flags = kFlagUnfinished | (fn.isAsync() ? kFlagAsync : 0);
  r->pad = 0;
  if (ts.record_shapes && fn.needsInputs()) {
    r->shape_offset = uint32_t(buf->shapes.size());
    encode_inputs(fn, buf->shapes);
  } else {
    r->shape_offset = kNoShapes;
  }
  void* mem;
  if (ts.ctx_free.empty()) {
    mem = ::operator new(sizeof(Ctx));
  } else {
    mem = ts.ctx_free.back();
    ts.ctx_free.pop_back();
  }
  std::unique_ptr<at::ObserverContext> ctx(new (mem) Ctx());
  auto* c = static_cast<Ctx*>(ctx.get());
  c->rec = r;
  r->end_ns = 0;
  r->start_ns = ticks();  // last, so our own work stays outside the range
  buf->busy.store(false, std::memory_order_release);
  return ctx;
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx_base) {
  int64_t t = ticks();
  if (ctx_base == nullptr) return;
  auto* ctx = static_cast<Ctx*>(ctx_base);
  ctx->rec->end_ns = t;
  ctx->rec->flags &= uint8_t(~kFlagUnfinished);
}

void start(bool record_shapes) {
  std::lock_guard<std::mutex> g(g_session_mu);
  if (g_session) {
    throw std::runtime_error("opscope native collector is already recording");
  }
  auto s = std::make_shared<Session>();
  s->generation = ++g_last_generation;
  s->record_shapes = record_shapes;
  g_session = s;
  auto cb = at::RecordFunctionCallback(on_start, on_end)
                .needsInputs(record_shapes)
                .needsIds(false);
  g_handle = at::addGlobalCallback(cb);
  g_active_generation.store(s->generation, std::memory_order_release);
}

// Ticks -> CLOCK_MONOTONIC ns; an unfinished end (0) stays 0.
void to_clock_ns(Record* recs, size_t n, ClockPoint stop_point) {
  if (!g_use_tsc) return;
  double span = double(stop_point.ticks - g_load_point.ticks);
  double scale = span > 0 ? double(stop_point.ns - g_load_point.ns) / span : 1.0;
  auto convert = [&](int64_t t) {
    return g_load_point.ns + int64_t(double(t - g_load_point.ticks) * scale);
  };
  for (size_t i = 0; i < n; ++i) {
    recs[i].start_ns = convert(recs[i].start_ns);
    if (recs[i].end_ns != 0) recs[i].end_ns = convert(recs[i].end_ns);
  }
}

// Frees the chunks whose records have all ended: they are never written
// again. A chunk holding an open record stays for its late end.
void free_finished_chunks(ThreadBuffer& t) {
  for (size_t c = 0; c < t.chunks.size(); ++c) {
    size_t k = (c + 1 == t.chunks.size()) ? t.used : kChunkRecords;
    const Record* recs = t.chunks[c].get();
    bool open = false;
    for (size_t i = 0; i < k && !open; ++i) open = (recs[i].flags & kFlagUnfinished) != 0;
    if (!open) t.chunks[c].reset();
  }
}

// Stops recording and returns the session as plain bytes:
// (records, shapes_per_thread, thread_os_ids, names, stop_ns)
py::tuple stop() {
  std::shared_ptr<Session> s;
  {
    std::lock_guard<std::mutex> g(g_session_mu);
    if (!g_session) {
      throw std::runtime_error("opscope native collector is not recording");
    }
    g_active_generation.store(0, std::memory_order_seq_cst);
    at::removeCallback(g_handle);
    s = std::move(g_session);
    g_session.reset();
  }
  ClockPoint stop_point = clock_point();
  int64_t stop_ns = stop_point.ns;
  std::lock_guard<std::mutex> g(s->mu);
  for (ThreadBuffer* t : s->threads) {
    while (t->busy.load(std::memory_order_acquire)) {
    }
  }
  size_t total = 0;
  for (ThreadBuffer* t : s->threads) total += t->count();
  std::string blob(total * sizeof(Record), '\0');
  char* dst = &blob[0];
  Record* out_records = reinterpret_cast<Record*>(dst);
  py::list shapes, tids;
  for (ThreadBuffer* t : s->threads) {
    for (size_t c = 0; c < t->chunks.size(); ++c) {
      size_t k = (c + 1 == t->chunks.size()) ? t->used : kChunkRecords;
      std::memcpy(dst, t->chunks[c].get(), k * sizeof(Record));
      dst += k * sizeof(Record);
    }
    shapes.append(py::bytes(reinterpret_cast<const char*>(t->shapes.data()),
                            t->shapes.size() * sizeof(int64_t)));
    tids.append(t->os_tid);
    free_finished_chunks(*t);
    std::vector<int64_t>().swap(t->shapes);
  }
  to_clock_ns(out_records, total, stop_point);
  py::list names;
  {
    std::lock_guard<std::mutex> gn(g_names.mu);
    for (const auto& n : g_names.names) names.append(py::str(n));
  }
  return py::make_tuple(py::bytes(blob), shapes, tids, names, stop_ns);
}

bool is_recording() {
  return g_active_generation.load(std::memory_order_acquire) != 0;
}

// A user range as a real at::RecordFunction, so every observer sees it.
int64_t range_push(const std::string& name) {
  auto rf = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (rf->isActive()) {
    rf->before(name);
  }
  return reinterpret_cast<int64_t>(rf.release());
}

void range_pop(int64_t handle) {
  auto* rf = reinterpret_cast<at::RecordFunction*>(handle);
  rf->end();
  delete rf;
}

// An observer that records nothing: it measures what RecordFunction itself
// costs once any global callback is registered (the floor under our cost).
std::unique_ptr<at::ObserverContext> empty_start(const at::RecordFunction&) {
  return nullptr;
}
void empty_end(const at::RecordFunction&, at::ObserverContext*) {}
at::CallbackHandle g_empty_handle = 0;

void empty_observer_start(bool needs_inputs) {
  if (g_empty_handle == 0) {
    g_empty_handle = at::addGlobalCallback(
        at::RecordFunctionCallback(empty_start, empty_end).needsInputs(needs_inputs));
  }
}

void empty_observer_stop() {
  if (g_empty_handle != 0) {
    at::removeCallback(g_empty_handle);
    g_empty_handle = 0;
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("start", &start, "Start recording RecordFunction events");
  m.def("stop", &stop, "Stop recording and return the raw session");
  m.def("is_recording", &is_recording);
  m.def("now_ns", &now_ns, "CLOCK_MONOTONIC in ns, the clock of all records");
  m.def("range_push", &range_push);
  m.def("range_pop", &range_pop);
  m.def("empty_observer_start", &empty_observer_start, py::arg("needs_inputs") = false,
        "Register a do-nothing global callback (benchmarks: RecordFunction's own cost)");
  m.def("empty_observer_stop", &empty_observer_stop);
  m.attr("RECORD_SIZE") = int(sizeof(Record));
}
