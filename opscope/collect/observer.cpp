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

constexpr uint32_t kNoShapes = 0xFFFFFFFFu;
constexpr uint32_t kNoStack = 0xFFFFFFFFu;
constexpr int kMaxStackDepth = 128;
constexpr uint8_t kFlagUnfinished = 1;
constexpr uint8_t kFlagAsync = 2;
// Record and input memory comes in regions of 2 MiB (see RegionPool).
constexpr size_t kRegionBytes = size_t(2) << 20;

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
  // Internal only (0 in the records stop() returns, where it is the first byte
  // of records.py's pad): 1 while torch holds this record's context, which
  // lives in the same chunk (see Ctx).
  uint8_t context_held;
  uint8_t pad;
};
static_assert(sizeof(Record) == 48, "Record layout must match model/records.py");

// One allocation (bytes > 0) or free (bytes < 0) reported by a torch allocator.
// Mirrored by MEMORY_DTYPE in opscope/model/records.py.
struct MemRecord {
  int64_t time_ns;
  int64_t addr;
  int64_t bytes;
  int64_t total_allocated;
  int64_t total_reserved;
  int32_t thread_index;
  int8_t device_type;
  int8_t device_index;
  uint16_t pad;
};
static_assert(sizeof(MemRecord) == 48, "MemRecord layout must match records.py");

// A Python frame as captured at op entry: the code object and the offset of
// its current instruction. Lines are resolved once, at stop.
// A frame's filename and name objects are kept in the key so that a code
// object freed and another allocated at its address does not match.
struct FrameKey {
  PyCodeObject* code;
  int lasti;
  PyObject* filename;
  PyObject* name;
  bool operator==(const FrameKey& o) const {
    return code == o.code && lasti == o.lasti && filename == o.filename && name == o.name;
  }
};
struct FrameKeyHash {
  size_t operator()(const FrameKey& k) const {
    return std::hash<const void*>()(k.code) ^ (size_t(k.lasti) * 0x9e3779b97f4a7c15ULL);
  }
};
struct ResolvedFrame {
  std::string filename;
  int line;
  std::string name;
};

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


inline int64_t tsc() {
#if defined(__x86_64__)
  return int64_t(__rdtsc());
#else
  return now_ns();
#endif
}

inline int64_t ticks() { return g_use_tsc ? tsc() : now_ns(); }

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

// The context handed to torch for one record. It lives in the record's slot
// (below), so on_end finds the record at a fixed offset, and nothing is
// allocated or recycled per op: deleting it only marks the slot released.
struct Ctx final : public at::ObserverContext {
  static void operator delete(void* p);
};
static_assert(sizeof(Ctx) == sizeof(void*), "a context is its vtable pointer only");

// A chunk is one region: kChunkRecords slots of (context, record), 56 bytes each.
constexpr size_t kSlotBytes = sizeof(Ctx) + sizeof(Record);
constexpr size_t kChunkRecords = kRegionBytes / kSlotBytes;
constexpr size_t kChunkBytes = kChunkRecords * kSlotBytes;
static_assert(sizeof(Ctx) % alignof(Record) == 0 && kSlotBytes % alignof(Record) == 0,
              "records in slots stay aligned");

inline Record* slot_record(char* slot) { return reinterpret_cast<Record*>(slot + sizeof(Ctx)); }
inline Record* context_record(void* ctx) { return slot_record(static_cast<char*>(ctx)); }

void Ctx::operator delete(void* p) {
  // The last access to the slot: stop() may free the chunk once it reads this.
  __atomic_store_n(&context_record(p)->context_held, uint8_t(0), __ATOMIC_RELEASE);
}

// Where record chunks and input words live. A fresh page costs a fault when
// first written (about 1.4 us for 4 KiB on a VM, 20 ns per 56-byte slot:
// more than the rest of an op's record), so memory is taken in 2 MiB regions
// aligned for one transparent huge page each (MADV_HUGEPAGE: one page to
// back where the kernel allows it), backed whole when mapped, and a stopped
// session's regions are kept, up to kPooledRegions, for the next session to
// write without faults.
class RegionPool {
 public:
  static constexpr size_t kPooledRegions = 8;

  // A region of kRegionBytes, or nullptr when the kernel has none to give.
  char* take() {
    // Counted, so a caller can tell what a session holds while it records (the black box
    // rotates its window on it); one relaxed add per 2 MiB region.
    taken_.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!free_.empty()) {
        char* p = free_.back();
        free_.pop_back();
        return p;
      }
    }
    return map_region();
  }

  void give(char* p) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (free_.size() < kPooledRegions) {
        free_.push_back(p);
        return;
      }
    }
    munmap(p, kRegionBytes);
  }

  uint64_t taken() const { return taken_.load(std::memory_order_relaxed); }

  size_t pooled_bytes() {
    std::lock_guard<std::mutex> g(mu_);
    return free_.size() * kRegionBytes;
  }

  // In a forked child (after_fork_in_child): the lock may have been held by
  // a thread that is gone; the regions are the child's copies, still usable.
  void after_fork() { new (&mu_) std::mutex(); }

 private:
  static char* map_region() {
    // Map twice the size, keep the aligned middle, unmap the rest.
    size_t span = 2 * kRegionBytes;
    void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    uintptr_t aligned = (start + kRegionBytes - 1) & ~(uintptr_t(kRegionBytes) - 1);
    if (aligned > start) munmap(raw, aligned - start);
    size_t tail = start + span - (aligned + kRegionBytes);
    if (tail > 0) munmap(reinterpret_cast<void*>(aligned + kRegionBytes), tail);
    char* p = reinterpret_cast<char*>(aligned);
#ifdef MADV_HUGEPAGE
    madvise(p, kRegionBytes, MADV_HUGEPAGE);  // advice only: small pages if refused
#endif
    populate(p);
    return p;
  }

  // Backs the whole region now, in one call where the kernel can (Linux 5.14+),
  // so that a region kept for the next session has no page left to fault,
  // however much of it the last session filled.
  static void populate(char* p) {
    constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE
    if (madvise(p, kRegionBytes, kPopulateWrite) == 0) return;
    for (size_t off = 0; off < kRegionBytes; off += 4096) {
      reinterpret_cast<volatile char*>(p)[off] = 0;
    }
  }

  std::mutex mu_;
  std::vector<char*> free_;
  std::atomic<uint64_t> taken_{0};
};
RegionPool g_regions;

// What could not be written, since the module loaded: ops not recorded,
// inputs or stacks left out, allocator reports dropped, for want of memory
// (or, for inputs, an input torch throws on when asked to describe). Never
// an exception into torch (which would log every op, and, from an allocator
// report, fail the user's allocation) nor a stop() that waits forever.
std::atomic<uint64_t> g_dropped{0};
inline void count_dropped() { g_dropped.fetch_add(1, std::memory_order_relaxed); }

// Owns one region (or, for an oversized input run, a plain array).
struct RegionRelease {
  bool region = true;
  void operator()(void* p) const {
    if (region) {
      g_regions.give(static_cast<char*>(p));
    } else {
      delete[] static_cast<int64_t*>(p);
    }
  }
};

// Room for one more element of v, taken before a region is, so that the
// push_back after it cannot throw and lose the region. Geometric, as
// push_back's own growth is (reserve(size() + 1) would reallocate each time).
template <class V>
void reserve_one_more(V& v) {
  if (v.size() == v.capacity()) v.reserve(std::max<size_t>(8, 2 * v.size()));
}

// Encoded inputs (see encode_inputs): words in chunks that are never moved
// or copied while recording (stop() joins them), so a word's index stays its
// offset in the joined array.
struct InputWords {
  static constexpr size_t kChunkWords = kRegionBytes / sizeof(int64_t);
  struct Chunk {
    std::unique_ptr<int64_t[], RegionRelease> words;
    size_t used;
  };
  std::vector<Chunk> chunks;
  int64_t* cur = nullptr;  // the next free word of the last chunk
  int64_t* end = nullptr;
  size_t size = 0;  // words in all chunks

  // Room for n more words in one run; returns where they go (then commit(n)).
  int64_t* reserve(size_t n) {
    if (__builtin_expect(size_t(end - cur) < n, 0)) grow(n);
    return cur;
  }
  void commit(size_t n) {
    cur += n;
    size += n;
  }
  __attribute__((noinline)) void grow(size_t n) {
    if (!chunks.empty()) chunks.back().used = size_t(cur - chunks.back().words.get());
    size_t cap = std::max(kChunkWords, n);
    reserve_one_more(chunks);
    if (cap == kChunkWords) {
      int64_t* words = reinterpret_cast<int64_t*>(g_regions.take());
      if (words == nullptr) throw std::bad_alloc();  // caught by encode_inputs
      chunks.push_back(Chunk{std::unique_ptr<int64_t[], RegionRelease>(words), 0});
    } else {
      chunks.push_back(Chunk{std::unique_ptr<int64_t[], RegionRelease>(
                                 new int64_t[cap], RegionRelease{false}),
                             0});
    }
    cur = chunks.back().words.get();
    end = cur + cap;
  }
  std::string joined() {
    if (!chunks.empty()) chunks.back().used = size_t(cur - chunks.back().words.get());
    std::string out(size * sizeof(int64_t), '\0');
    char* dst = &out[0];
    for (const Chunk& c : chunks) {
      std::memcpy(dst, c.words.get(), c.used * sizeof(int64_t));
      dst += c.used * sizeof(int64_t);
    }
    return out;
  }
  void release() {
    std::vector<Chunk>().swap(chunks);
    cur = end = nullptr;
    size = 0;
  }
};

struct ThreadBuffer {
  int32_t index = 0;
  int64_t os_tid = 0;
  std::vector<std::unique_ptr<char[], RegionRelease>> chunks;  // one region each
  char* cursor = nullptr;  // the next free slot of the last chunk
  char* limit = nullptr;   // the end of the last chunk
  InputWords shapes;  // encoded inputs, see encode_inputs
  std::vector<MemRecord> memory;  // allocations and frees on this thread
  // with_stack: one stack id per record, in record order; stacks interned per
  // thread as runs of frames in stack_frames (innermost first).
  std::vector<uint32_t> stack_ids;
  std::unordered_map<uint64_t, std::vector<uint32_t>> stack_by_hash;
  std::vector<uint32_t> stack_begin;  // stack id -> first entry; one extra at the end
  std::vector<uint32_t> stack_frames;  // entries: frame ids, innermost first
  std::unordered_map<FrameKey, uint32_t, FrameKeyHash> frame_ids;
  std::vector<FrameKey> frame_keys;  // frame id -> key
  std::vector<ResolvedFrame> frame_text;  // frame id -> text
  std::atomic<bool> busy{false};  // an on_start is writing; stop waits on it
  std::atomic<bool> stopped{false};  // its session's stop is done with it: only late ends write

  // The next free slot, or nullptr when no memory is left for a new chunk.
  char* next_slot() {
    if (__builtin_expect(cursor == limit, 0) && !add_chunk()) return nullptr;
    char* slot = cursor;
    cursor += kSlotBytes;
    return slot;
  }
  __attribute__((noinline)) bool add_chunk() noexcept {
    try {
      reserve_one_more(chunks);
    } catch (const std::bad_alloc&) {
      return false;
    }
    char* region = g_regions.take();
    if (region == nullptr) return false;
    chunks.emplace_back(region);
    cursor = region;
    limit = cursor + kChunkBytes;
    return true;
  }
  // Records in chunk c (the last one may be partly used).
  size_t used_in(size_t c) const {
    if (c + 1 < chunks.size()) return kChunkRecords;
    return size_t(cursor - (limit - kChunkBytes)) / kSlotBytes;
  }
  size_t count() const {
    return chunks.empty() ? 0 : (chunks.size() - 1) * kChunkRecords + used_in(chunks.size() - 1);
  }
};

// Every ThreadBuffer ever made, so contexts can hold plain pointers: a buffer
// object (a few hundred bytes) is never freed, only its chunks are, once no
// record in them is still open (see stop()). Guarded by g_session_mu.
std::deque<std::unique_ptr<ThreadBuffer>> g_all_buffers;

struct Session {
  uint64_t generation = 0;
  bool record_shapes = false;
  bool with_stack = false;
  bool light_fence = false;  // on_start_fast's handshake leaves the fence to stop() (membarrier)
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

// A name a RecordFunction holds, cached by content (own_name_slot): its
// length and quick key (NameKey), and its words, compared in full on a hit.
struct NameCacheSlot {
  uint32_t size = 0;  // the name's length
  int32_t id = -1;
  uint64_t mid = 0;  // NameKey::mid
  uint64_t tail = 0;  // NameKey::tail
  const uint64_t* words = nullptr;  // the name, NUL-terminated, zero-padded to whole words
};
static_assert(sizeof(NameCacheSlot) == 32, "a cache slot is four words");

// Names seen by content: open addressing over (hash, interned copy), no
// std::string built per lookup.
struct NameMap {
  struct Entry {
    uint64_t hash;
    const char* str;  // interned copy; nullptr: empty
    size_t len;
    int32_t id;
    const uint64_t* words;  // the name zero-padded to whole words (NameCacheSlot::words)
  };
  std::vector<Entry> table = std::vector<Entry>(64, Entry{0, nullptr, 0, -1, nullptr});
  size_t used = 0;

  static uint64_t hash_of(const char* s, size_t n) {
    uint64_t h = 0x243f6a8885a308d3ULL ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
      h ^= h >> 29;
    }
    uint64_t tail = 0;
    std::memcpy(&tail, s + i, n - i);
    h = (h ^ tail) * 0x9e3779b97f4a7c15ULL;
    return h ^ (h >> 32);
  }
  const Entry* find(const char* s, size_t n, uint64_t h) const {
    size_t mask = table.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Entry& e = table[i];
      if (e.str == nullptr) return nullptr;
      if (e.hash == h && e.len == n && std::memcmp(e.str, s, n) == 0) return &e;
    }
  }
  const Entry* insert(const char* str, size_t n, uint64_t h, int32_t id, const uint64_t* words) {
    if (2 * (used + 1) > table.size()) {
      std::vector<Entry> old(table.size() * 2, Entry{0, nullptr, 0, -1, nullptr});
      old.swap(table);
      for (const Entry& e : old) {
        if (e.str != nullptr) place(e);
      }
    }
    ++used;
    return place(Entry{h, str, n, id, words});
  }
  const Entry* place(const Entry& e) {
    size_t mask = table.size() - 1;
    size_t i = e.hash & mask;
    while (table[i].str != nullptr) i = (i + 1) & mask;
    table[i] = e;
    return &table[i];
  }
};

// ThreadState::fast_key of a thread that on_start_fast never serves.
constexpr uint64_t kNoFastKey = ~uint64_t(0);
// Direct-mapped name caches, large enough that a step's few dozen names
// rarely share a slot (two that do would evict each other at every call).
constexpr int kNameSlotBits = 10;
constexpr size_t kNameSlots = size_t(1) << kNameSlotBits;

// Names that live in an operator's schema: the pointer identifies the name
// for as long as the operator is registered (see g_names_epoch). Slot i of a
// thread's cache is schema_keys[i] (the RecordFunction's schema reference,
// see descriptor_key; 0: empty) and schema_ids[i]: two arrays, so that each
// is indexed by the slot without a multiply.

struct ThreadState {
  uint64_t generation = 0;
  bool record_shapes = false;
  bool with_stack = false;
  bool skip = false;  // an intra-op pool worker: torch.profiler never sees these
  // on_start_fast's case, a thread that records neither stacks nor as a
  // skipped worker (the session's on_start_fast then matches its inputs
  // option): fast_key_of(the generation it joined, names_epoch); compared
  // with g_fast_key at each op. Else kNoFastKey.
  uint64_t fast_key = kNoFastKey;
  uint64_t names_epoch = 0;  // g_names_epoch when the schema slots were last valid
  uintptr_t schema_keys[kNameSlots] = {};
  int32_t schema_ids[kNameSlots] = {};
  ThreadBuffer* buffer = nullptr;
  uintptr_t self = 0;  // the owning thread's thread pointer (thread_pointer())
  uint64_t rf_thread = 0;  // its slot in g_state_by_rf_thread, or 0
  NameCacheSlot cache[kNameSlots];
  NameMap by_content;
  std::deque<std::vector<uint64_t>> padded;  // NameMap::Entry::words, one per name seen
  ~ThreadState();
};

// A value unique to each live thread, read without a TLS lookup: the thread
// pointer (glibc and musl both keep the thread's own control block there).
inline uintptr_t thread_pointer() {
#if defined(__x86_64__)
  uintptr_t tp;
  asm("movq %%fs:0, %0" : "=r"(tp));
  return tp;
#elif defined(__aarch64__)
  uintptr_t tp;
  asm("mrs %0, tpidr_el0" : "=r"(tp));
  return tp;
#else
  return uintptr_t(pthread_self());
#endif
}

// The state of each thread is found in on_start through torch's own thread
// number (fn.threadId(), already in the RecordFunction), checked against the
// thread pointer: no TLS lookup per op. Threads numbered past the table, or a
// mismatch, take the thread_local path.
// A slot holds no state as g_no_state, whose thread pointer matches no thread.
constexpr uint64_t kStateSlots = 4096;
std::atomic<ThreadState*> g_state_by_rf_thread[kStateSlots];
ThreadState g_no_state;

void clear_state_slots() {
  for (auto& slot : g_state_by_rf_thread) slot.store(&g_no_state, std::memory_order_relaxed);
}

inline std::atomic<ThreadState*>& state_slot(uint64_t rf_thread) {
  return g_state_by_rf_thread[rf_thread & (kStateSlots - 1)];
}

thread_local ThreadState* t_state_ptr = nullptr;
thread_local std::unique_ptr<ThreadState> t_state_owner;

ThreadState::~ThreadState() {
  if (rf_thread != 0) {
    ThreadState* me = this;
    state_slot(rf_thread).compare_exchange_strong(me, &g_no_state);
  }
  t_state_ptr = nullptr;
}

inline ThreadState& thread_state() {
  ThreadState* s = t_state_ptr;
  if (__builtin_expect(s == nullptr, 0)) {
    t_state_owner.reset(new ThreadState());
    s = t_state_ptr = t_state_owner.get();
    s->self = thread_pointer();
  }
  return *s;
}

__attribute__((noinline)) ThreadState& thread_state_slow(uint64_t rf_thread) {
  ThreadState& s = thread_state();
  if (s.rf_thread == 0 && rf_thread != 0) {
    ThreadState* empty = &g_no_state;  // a thread sharing the slot keeps it
    if (state_slot(rf_thread).compare_exchange_strong(empty, &s)) s.rf_thread = rf_thread;
  }
  return s;
}

inline ThreadState& thread_state_for(const at::RecordFunction& fn) {
  uint64_t rf_thread = fn.threadId();
  ThreadState* s = state_slot(rf_thread).load(std::memory_order_relaxed);
  if (__builtin_expect(s->self == thread_pointer() && s != &g_no_state, 1)) return *s;
  return thread_state_slow(rf_thread);
}

// Bumped whenever torch deregisters an operator, before its schema (and the
// name in it) is freed: every thread then forgets the schema name pointers it
// cached, so a pointer reused by another operator's name cannot hit.
std::atomic<uint64_t> g_names_epoch{0};

// What on_start_fast compares with a thread's fast_key, one word for two
// checks: the session's generation (under 2^32: start() makes sure) and the
// names epoch. 0 while not recording; no thread's key is 0.
std::atomic<uint64_t> g_fast_key{0};

inline uint64_t fast_key_of(uint64_t generation, uint64_t epoch) {
  return (epoch << 32) | generation;
}
inline uint64_t generation_of(uint64_t fast_key) { return fast_key & 0xffffffffu; }

struct NameEpochListener final : public c10::OpRegistrationListener {
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle&) override {
    g_names_epoch.fetch_add(1, std::memory_order_release);
    // Threads leave on_start_fast until they have forgotten their cached
    // schema names (on_start_general). The key is re-read with the epoch at
    // each try, so that of two listeners racing the newer epoch stays.
    uint64_t key = g_fast_key.load(std::memory_order_acquire);
    while (key != 0) {
      uint64_t epoch = g_names_epoch.load(std::memory_order_acquire);
      uint64_t next = fast_key_of(generation_of(key), epoch);
      if (g_fast_key.compare_exchange_weak(key, next, std::memory_order_acq_rel)) break;
    }
  }
};

// Forgets ts's cached schema names if an operator was deregistered since
// they were cached; returns the epoch they are now valid for.
uint64_t refresh_schema_names(ThreadState& ts) {
  uint64_t epoch = g_names_epoch.load(std::memory_order_acquire);
  if (ts.names_epoch != epoch) {
    std::fill(std::begin(ts.schema_keys), std::end(ts.schema_keys), 0);
    ts.names_epoch = epoch;
  }
  return epoch;
}

// torch built with the pre-C++11 library ABI (the registry's wheels up to
// torch 2.7) has copy-on-write strings: one pointer to the characters, with
// the length in the header just before them ({length, capacity, refcount}).
#if defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI == 0
constexpr bool kCowStrings = true;
#else
constexpr bool kCowStrings = false;
#endif

// The length of the string whose characters start at data, the string being
// a copy-on-write one (kCowStrings).
inline size_t cow_string_size(const char* data) {
  size_t size;
  std::memcpy(&size, data - 3 * sizeof(size_t), sizeof(size));
  return size;
}

// Where, inside an at::RecordFunction, the std::string holding a name of its
// own lives (a range's or an autograd node's name, as opposed to an operator
// schema's): found once by looking at a fresh RecordFunction, whose name is
// an empty string of its own. -1 when the layout is not the expected one
// (then every name is checked by content, as if it were a range's).
std::ptrdiff_t find_own_name_offset() {
  at::RecordFunction probe(at::RecordScope::FUNCTION);  // no before(): no callback runs
  const char* name = probe.name();
  const char* base = reinterpret_cast<const char*>(&probe);
  if (kCowStrings) {  // the one word of the object that points at the name
    std::ptrdiff_t found = -1;
    for (size_t at = 0; at + sizeof(std::string) + 1 <= sizeof(at::RecordFunction);
         at += alignof(std::string)) {
      const char* data;
      std::memcpy(&data, base + at, sizeof(data));
      if (data != name) continue;
      if (found >= 0) return -1;
      found = std::ptrdiff_t(at);
    }
    return (found >= 0 && cow_string_size(name) == 0 && name[0] == '\0') ? found : -1;
  }
  std::ptrdiff_t at = name - base - std::ptrdiff_t(2 * sizeof(void*));  // {data, size, buffer}
  if (at < 0 || size_t(at) + sizeof(std::string) + 1 > sizeof(at::RecordFunction)) return -1;
  const char* data;
  size_t size;
  std::memcpy(&data, base + at, sizeof(data));
  std::memcpy(&size, base + at + sizeof(void*), sizeof(size));
  return (data == name && size == 0 && name[0] == '\0') ? at : -1;
}
std::ptrdiff_t g_own_name_offset = -1;  // set by start(), before the callback is added

// The word at g_own_name_offset: the data pointer of a name fn holds, or else
// (an operator) what fn keeps to reach the operator's schema, which names
// the operator for as long as it is registered.
inline uintptr_t descriptor_key(const at::RecordFunction& fn) {
  uintptr_t key;
  std::memcpy(&key, reinterpret_cast<const char*>(&fn) + g_own_name_offset, sizeof(key));
  return key;
}

// Whether fn's name is a string fn holds (true also when that cannot be told).
inline bool owns_name(const at::RecordFunction& fn, const char* name) {
  return g_own_name_offset < 0 || descriptor_key(fn) == reinterpret_cast<uintptr_t>(name);
}

// Multiplicative: schemas sit in torch's operator table at regular strides,
// which low address bits alone would send to a few slots.
inline size_t key_slot(uintptr_t key) {
  return size_t((key * 0x9e3779b97f4a7c15ULL) >> (64 - kNameSlotBits));
}

// Names fn holds are cached by content: autograd builds its
// "evaluate_function: ..." names anew for each call, at varying addresses.
// A name's quick key: its last 16 bytes (autograd's names share their first
// bytes and end in "Backward0": the node's own name sits just before), or
// for a name under 16 bytes its first aligned word (cut at its length when
// under 8) and its last 8 bytes. Every read lies inside the name, but for a
// name under 8 bytes: name must be 8-byte aligned, as std::string's buffers
// are, so that word, which holds the NUL, never leaves the name's page.
struct NameKey {
  uint64_t mid;  // bytes [size - 16, size - 8), or [0, 8) under 16 bytes
  uint64_t tail;  // bytes [size - 8, size), or 0 under 8 bytes
};
__attribute__((no_sanitize_address, always_inline)) inline NameKey name_key(const char* name,
                                                                            size_t size) {
  NameKey k{0, 0};
  if (__builtin_expect(size >= 16, 1)) {
    std::memcpy(&k.mid, name + size - 16, 8);
    std::memcpy(&k.tail, name + size - 8, 8);
  } else {
    std::memcpy(&k.mid, name, 8);
    if (size >= 8) {
      std::memcpy(&k.tail, name + size - 8, 8);
    } else {
      k.mid &= (uint64_t(1) << (8 * size)) - 1;
    }
  }
  return k;
}

// The cache slot of a name: from its length and quick key.
inline size_t own_name_slot(const NameKey& k, size_t size) {
  uint64_t h = (k.mid ^ size ^ ((k.tail << 29) | (k.tail >> 35))) * 0x9e3779b97f4a7c15ULL;
  return size_t(h >> (64 - kNameSlotBits));
}

// The length of the name fn holds (std::string: {data, size, ...}, or a
// copy-on-write string's data pointer).
inline size_t own_name_size(const at::RecordFunction& fn) {
  const char* field = reinterpret_cast<const char*>(&fn) + g_own_name_offset;
  if (kCowStrings) {
    const char* data;
    std::memcpy(&data, field, sizeof(data));
    return cow_string_size(data);
  }
  size_t size;
  std::memcpy(&size, field + sizeof(void*), sizeof(size));
  return size;
}

// Which alternative fn's name is: the byte after the std::string in
// at::RecordFunction's variant (0: a name of its own, 1: a schema). Trusted
// by on_start_fast only once name_id has seen both values where expected and
// never another (g_variant_index_checks == kIndexConfirmed).
constexpr int kIndexSchemaSeen = 1, kIndexOwnSeen = 2, kIndexContradicted = 4;
constexpr int kIndexConfirmed = kIndexSchemaSeen | kIndexOwnSeen;
std::atomic<int> g_variant_index_checks{0};

inline uint8_t variant_index(const at::RecordFunction& fn) {
  return uint8_t(reinterpret_cast<const char*>(&fn)[g_own_name_offset + sizeof(std::string)]);
}

inline void check_variant_index(const at::RecordFunction& fn, bool owned) {
  int bit = variant_index(fn) == (owned ? 0 : 1)
                ? (owned ? kIndexOwnSeen : kIndexSchemaSeen) : kIndexContradicted;
  if ((g_variant_index_checks.load(std::memory_order_relaxed) & bit) == 0) {
    g_variant_index_checks.fetch_or(bit, std::memory_order_relaxed);
  }
}

// Where isAsync() reads its flag inside an at::RecordFunction: found once by
// marking a fresh RecordFunction async and seeing which byte changes; -1 if
// not exactly one byte goes from 0 to 1.
std::ptrdiff_t find_async_offset() {
  at::RecordFunction probe(at::RecordScope::FUNCTION);
  unsigned char before[sizeof(at::RecordFunction)], after[sizeof(at::RecordFunction)];
  std::memcpy(before, static_cast<const void*>(&probe), sizeof(before));
  bool was_async = probe.isAsync();
  probe._setAsync();
  std::memcpy(after, static_cast<const void*>(&probe), sizeof(after));
  if (was_async || !probe.isAsync()) return -1;
  std::ptrdiff_t found = -1;
  for (size_t i = 0; i < sizeof(before); ++i) {
    if (before[i] == after[i]) continue;
    if (found >= 0 || before[i] != 0 || after[i] != 1) return -1;
    found = std::ptrdiff_t(i);
  }
  return found;
}
std::ptrdiff_t g_async_offset = -1;  // set by start(), as g_own_name_offset

// A name by content (n: its length): from the thread's map, or interned;
// fills the cache slot c with it.
__attribute__((noinline)) int32_t name_id_slow(ThreadState& ts, NameCacheSlot& c,
                                               const char* name, size_t n) {
  uint64_t h = NameMap::hash_of(name, n);
  const NameMap::Entry* e = ts.by_content.find(name, n, h);
  if (e == nullptr) {
    int32_t id;
    const char* str = g_names.intern(name, &id)->c_str();  // interned copies never move
    ts.padded.emplace_back(n / 8 + 1, 0);
    std::memcpy(ts.padded.back().data(), name, n);
    e = ts.by_content.insert(str, n, h, id, ts.padded.back().data());
  }
  int32_t id = e->id;
  if (n >= (size_t(1) << 32)) return id;  // never cached (NameCacheSlot::size)
  NameKey k = name_key(reinterpret_cast<const char*>(e->words), n);  // the padded copy
  c.words = e->words;
  c.mid = k.mid;
  c.tail = k.tail;
  c.size = uint32_t(n);
  c.id = id;
  return id;
}

// Whether name (of length size, quick key k) is the cached one: the length
// and quick key, then the 8-byte words before the last 16 bytes, two at a
// time; every read lies inside the name.
__attribute__((always_inline)) inline bool same_name(const NameCacheSlot& c, const char* name,
                                                     size_t size, const NameKey& k) {
  if (c.size != size || c.mid != k.mid || c.tail != k.tail || c.words == nullptr) return false;
  const uint64_t* w = c.words;
  size_t n = size > 16 ? (size - 9) / 8 : 0;  // words [0, n) cover [0, size - 16)
  size_t i = 0;
  uint64_t a, b;
  for (; i + 1 < n; i += 2) {
    std::memcpy(&a, name + 8 * i, 8);
    std::memcpy(&b, name + 8 * i + 8, 8);
    if (((a ^ w[i]) | (b ^ w[i + 1])) != 0) return false;
  }
  if (i < n) {
    std::memcpy(&a, name + 8 * i, 8);
    if (a != w[i]) return false;
  }
  return true;
}

int32_t name_id(ThreadState& ts, const at::RecordFunction& fn, const char* name) {
  bool owned = owns_name(fn, name);
  if (g_own_name_offset >= 0) check_variant_index(fn, owned);
  if (!owned) {  // an operator's schema name: the pointer is the key
    refresh_schema_names(ts);
    uintptr_t key = descriptor_key(fn);
    size_t slot = key_slot(key), pair = slot ^ 1;
    if (ts.schema_keys[slot] == key) return ts.schema_ids[slot];
    if (ts.schema_keys[pair] == key) return ts.schema_ids[pair];
    // Two slots per key: two operators whose schemas share a slot (likely among a
    // step's few dozen, at addresses the heap chose) do not evict each other.
    size_t into = ts.schema_keys[slot] == 0 ? slot : pair;
    NameCacheSlot scratch;
    ts.schema_ids[into] = name_id_slow(ts, scratch, name, std::strlen(name));
    ts.schema_keys[into] = key;
    return ts.schema_ids[into];
  }
  // A name fn holds (or any name, when the layout is unknown): its buffer may
  // be reused for another name, so it is looked up by content.
  size_t size = g_own_name_offset >= 0 ? own_name_size(fn) : std::strlen(name);
  if ((reinterpret_cast<uintptr_t>(name) & 7) != 0) {  // not a std::string's buffer
    NameCacheSlot scratch;
    return name_id_slow(ts, scratch, name, size);
  }
  NameKey k = name_key(name, size);
  NameCacheSlot& c = ts.cache[own_name_slot(k, size)];
  if (__builtin_expect(same_name(c, name, size, k), 1)) return c.id;
  return name_id_slow(ts, c, name, size);
}

// Input encoding, one entry per input, read by model/records.py:decode_inputs.
//   0: none/other   1: tensor [ndim, sizes..., strides..., dtype]
//   2: int [value]  3: double [bits]  4: bool [value]
//   5: tensor list [count]  6: int list [count, values...]  7: string
//
// An op's words are written through a local cursor (InputRun) into room
// reserved once: kInputWordsInline words for each input, the most a tensor
// of up to kInlineDims dims, a scalar, a string or a tensor list takes.
// Before input i there is always room for (inputs - i) such inputs: one that
// takes more (a tensor of more dims, an int or bool list) asks for its own
// words plus that room for the inputs after it (InputRun::room). Nothing is
// pushed word by word.
constexpr int64_t kInlineDims = C10_SIZES_AND_STRIDES_MAX_INLINE_SIZE;
constexpr size_t kInputWordsInline = 3 + 2 * kInlineDims;  // the most a common input takes

// Passed by value to out-of-line helpers (and returned), so that the cursor
// stays in a register on the common path.
struct InputRun {
  InputWords* out;
  int64_t* start;  // the first word not yet committed
  int64_t* w;  // the next word
  int64_t* end;  // the end of the reserved room

  InputRun(InputWords& o, size_t need) : out(&o) {
    start = w = out->reserve(need);
    end = out->end;
  }
  // Room for need more words (commits what is written when it must grow).
  void room(size_t need) {
    if (__builtin_expect(size_t(end - w) < need, 0)) {
      out->commit(size_t(w - start));
      start = w = out->reserve(need);
      end = out->end;
    }
  }
  void finish() { out->commit(size_t(w - start)); }
};

// Copies n words: up to five (torch's inline dims) without a loop or a call.
inline void copy_dims(int64_t* to, const int64_t* from, int64_t n) {
  switch (n) {
    case 5: to[4] = from[4]; [[fallthrough]];
    case 4: to[3] = from[3]; [[fallthrough]];
    case 3: to[2] = from[2]; [[fallthrough]];
    case 2: to[1] = from[1]; [[fallthrough]];
    case 1: to[0] = from[0]; [[fallthrough]];
    case 0: break;
    default: std::memcpy(to, from, size_t(n) * sizeof(int64_t));
  }
}

// TensorImpl's sizes and strides, read as its own inline accessors read them
// (sizes(), strides()), through members it keeps protected: a pointer to a
// protected member, formed in a derived class's scope, is legal C++.
struct TensorImplPeek : c10::TensorImpl {
  // Whether sizes and strides are both torch's own (no subclass overrides them).
  static bool default_sizes_strides(const c10::TensorImpl& t) {
    return !(t.*(&TensorImplPeek::matches_policy))(SizesStridesPolicy::CustomStrides);
  }
  static const c10::impl::SizesAndStrides& sizes_and_strides(const c10::TensorImpl& t) {
    return t.*(&TensorImplPeek::sizes_and_strides_);
  }
};

// A tensor outside encode_tensor's common case (more dims than fit inline,
// another layout, sizes or strides a subclass computes), through TensorImpl's
// public accessors.
__attribute__((noinline)) InputRun encode_tensor_general(const c10::TensorImpl* impl, InputRun run,
                                                         size_t inputs_left) {
  c10::IntArrayRef size_list = impl->sizes();  // its length is dim()
  const int64_t* sizes = size_list.data();
  int64_t nd = int64_t(size_list.size());
  if (__builtin_expect(nd > kInlineDims, 0)) {
    run.room(size_t(3 + 2 * nd) + inputs_left * kInputWordsInline);
  }
  int64_t* w = run.w;
  w[0] = 1;
  w[1] = nd;
  copy_dims(w + 2, sizes, nd);
  if (impl->layout() == at::kStrided) {
    copy_dims(w + 2 + nd, impl->strides().data(), nd);
  } else {
    for (int64_t i = 0; i < nd; ++i) w[2 + nd + i] = 0;
  }
  w[2 + 2 * nd] = int64_t(c10::typeMetaToScalarType(impl->dtype()));
  run.w = w + 3 + 2 * nd;
  return run;
}

// A tensor: [1, ndim, sizes..., strides..., dtype], or [0] when undefined.
// inputs_left: how many inputs follow, whose room is kept. The common case (a
// strided tensor whose sizes and strides torch keeps inline) copies all
// kInlineDims words of each: the words past ndim lie inside torch's inline
// array, and land inside this input's room, where the strides and the dtype,
// or the next input, overwrite them.
inline void encode_tensor(const at::Tensor& t, InputRun& run, size_t inputs_left) {
  if (!t.defined()) {
    *run.w++ = 0;
    return;
  }
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (__builtin_expect(TensorImplPeek::default_sizes_strides(*impl), 1)) {
    const c10::impl::SizesAndStrides& dims = TensorImplPeek::sizes_and_strides(*impl);
    size_t nd = dims.size();
    if (__builtin_expect(nd <= size_t(kInlineDims) && impl->layout() == at::kStrided, 1)) {
      static_assert(kInputWordsInline >= 2 + 2 * kInlineDims + 1, "the copies fit the room");
      const int64_t* sizes = dims.sizes_data();  // read before any word is written
      const int64_t* strides = dims.strides_data();
      int64_t dtype = int64_t(c10::typeMetaToScalarType(impl->dtype()));
      int64_t* w = run.w;
      w[0] = 1;
      w[1] = int64_t(nd);
      std::memcpy(w + 2, sizes, sizeof(int64_t) * kInlineDims);
      std::memcpy(w + 2 + nd, strides, sizeof(int64_t) * kInlineDims);
      w[2 + 2 * nd] = dtype;
      run.w = w + 3 + 2 * nd;
      return;
    }
  }
  run = encode_tensor_general(impl, run, inputs_left);
}

// An IValue's 8-byte payload (its first member): an int's value, a double's
// bits, a list's ListImpl.
static_assert(sizeof(c10::IValue) == 16, "IValue: an 8-byte payload, then its tag");
inline int64_t payload_word(const c10::IValue& v) {
  int64_t w;
  std::memcpy(&w, static_cast<const void*>(&v), sizeof(w));
  return w;
}

// What a list holds: its element type's kind is what isTensorList() and
// isIntList() test first; another kind is told by torch's own checks, as
// before.
enum class ListKind { kOther, kTensor, kInt, kBool };
__attribute__((noinline, cold)) ListKind list_kind_by_torch(const c10::IValue& v) {
  if (v.isTensorList()) return ListKind::kTensor;
  if (v.isIntList()) return ListKind::kInt;
  if (v.isBoolList()) return ListKind::kBool;
  return ListKind::kOther;
}
inline ListKind list_kind(const c10::IValue& v, const c10::detail::ListImpl& list) {
  c10::TypeKind kind = list.elementType->kind();
  if (kind == c10::TypeKind::TensorType) return ListKind::kTensor;
  if (kind == c10::TypeKind::IntType) return ListKind::kInt;
  if (kind == c10::TypeKind::BoolType) return ListKind::kBool;
  return list_kind_by_torch(v);
}

// A bool list's elements as 0/1 (e.g. output_mask).
__attribute__((noinline, cold)) void put_bools(int64_t* w, const c10::IValue* items, size_t n) {
  for (size_t i = 0; i < n; ++i) w[i] = items[i].toBool() ? 1 : 0;
}

// A list: [5, count] for tensors, [6, count, values...] for ints and bools,
// else [0]; its elements are read in place (no list handle copied, no
// refcount). inputs_left: how many inputs follow, whose room is kept.
void encode_list(const c10::IValue& v, InputRun& run, size_t inputs_left) {
  const auto& list = *static_cast<const c10::detail::ListImpl*>(
      reinterpret_cast<const c10::intrusive_ptr_target*>(payload_word(v)));
  ListKind kind = list_kind(v, list);
  size_t n = list.list.size();
  if (kind == ListKind::kTensor) {
    run.w[0] = 5;
    run.w[1] = int64_t(n);
    run.w += 2;
  } else if (kind == ListKind::kInt || kind == ListKind::kBool) {
    run.room(2 + n + inputs_left * kInputWordsInline);
    int64_t* w = run.w;
    w[0] = 6;
    w[1] = int64_t(n);
    const c10::IValue* items = list.list.data();
    if (kind == ListKind::kInt) {
      for (size_t i = 0; i < n; ++i) w[2 + i] = payload_word(items[i]);
    } else {
      put_bools(w + 2, items, n);
    }
    run.w = w + 2 + n;
  } else {
    *run.w++ = 0;
  }
}

// encode_inputs' body: one run of words for fn's inputs; throws
// std::bad_alloc when a chunk for them cannot be had. Out of line, so that
// the handler in encode_inputs costs this loop nothing.
__attribute__((noinline)) void encode_input_run(const at::RecordFunction& fn, InputWords& out) {
  c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
  size_t n = inputs.size();
  InputRun run(out, 1 + n * kInputWordsInline);
  *run.w++ = int64_t(n);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = inputs[i];
    int64_t* w = run.w;
    if (v.isTensor()) {
      encode_tensor(v.toTensor(), run, n - i - 1);
    } else if (v.isInt()) {
      w[0] = 2;
      w[1] = payload_word(v);
      run.w = w + 2;
    } else if (v.isList()) {
      encode_list(v, run, n - i - 1);
    } else if (v.isDouble()) {
      w[0] = 3;
      w[1] = payload_word(v);  // the double's bits
      run.w = w + 2;
    } else if (v.isBool()) {
      w[0] = 4;
      w[1] = v.toBool() ? 1 : 0;
      run.w = w + 2;
    } else if (v.isString()) {
      *run.w++ = 7;
    } else {  // None and anything else
      *run.w++ = 0;
    }
  }
  run.finish();
}

// Returns where fn's inputs start in out, or kNoShapes when they could not
// be encoded (no memory for a chunk; an input torch refuses to describe): the
// op is still recorded, the words written so far are left unreferenced.
__attribute__((noinline)) uint32_t encode_inputs(const at::RecordFunction& fn,
                                                 InputWords& out) {
  try {
    uint32_t offset = uint32_t(out.size);
    encode_input_run(fn, out);
    return offset;
  } catch (const std::exception&) {
    count_dropped();
    return kNoShapes;
  }
}

bool join_session(ThreadState& ts, uint64_t gen) {
  std::lock_guard<std::mutex> g(g_session_mu);
  if (!g_session || g_session->generation != gen) return false;
  // Workers of at::parallel_for run ops only inside a parallel region, as a
  // non-master thread; the thread that opened the region is recorded.
  ThreadBuffer* buf = g_session->add_thread();  // workers too: their allocations count
  ts.skip = at::in_parallel_region() && at::get_thread_num() != 0;
  ts.generation = gen;  // only once the buffer is there (add_thread can throw)
  ts.buffer = buf;
  ts.record_shapes = g_session->record_shapes;
  ts.with_stack = g_session->with_stack;
  ts.fast_key = (ts.skip || ts.with_stack) ? kNoFastKey
                                           : fast_key_of(gen, refresh_schema_names(ts));
  return !ts.skip;
}

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
// The frame layout differs per CPython minor version: FrameLayouts below is
// the table, one row per layout. Adding a version is adding one row. A row's
// members that name version-specific fields (tstate->frame, ->cframe,
// co_code_adaptive...) are templates, so they compile only for the row
// chosen for the Python being built against.
// (tests/test_stack_layouts.py compiles the region between the
// OPSCOPE-FRAME-WALK markers alone against each installed CPython.)
// OPSCOPE-FRAME-WALK-BEGIN

// What the walk needs from one frame. code == nullptr: not a Python frame
// (a C-stack shim); lasti < 0: the frame has not started running yet.
struct FrameView {
  PyCodeObject* code;
  int lasti;  // byte offset of the current instruction, as PyCode_Addr2Line takes it
};

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

// Writes the record of a starting range into the next slot of ts's buffer
// and returns the context living in that slot. kFast: the caller checked that
// the chunk has room, the session needs neither inputs nor stacks, and the
// clock is the TSC, so nothing here calls out. rf_thread: fn.threadId().
//
// The handshake re-reads what the caller checked: kFast, g_fast_key (gen is
// the thread's fast key; a names epoch that moved meanwhile sends the op to
// on_start_general); else g_active_generation (gen is the generation).
std::unique_ptr<at::ObserverContext> on_start_general(const at::RecordFunction& fn);
template <bool kFast, bool kWithInputs = false, bool kLightFence = false>
inline std::unique_ptr<at::ObserverContext> write_start(const at::RecordFunction& fn,
                                                        ThreadState& ts, uint64_t gen,
                                                        int32_t name_id, uint32_t async,
                                                        uint64_t rf_thread) {
  ThreadBuffer* buf = ts.buffer;
  // Dekker handshake with stop(): publish busy, then re-check the generation.
  // kLightFence: the full fence between the two is stop()'s membarrier, which
  // makes every running thread of the process execute one (an asymmetric
  // fence); here the compiler keeps the order.
  if (kLightFence) {
    buf->busy.store(true, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    buf->busy.store(true, std::memory_order_seq_cst);
  }
  const std::atomic<uint64_t>& now = kFast ? g_fast_key : g_active_generation;
  constexpr auto order = kLightFence ? std::memory_order_relaxed : std::memory_order_seq_cst;
  if (__builtin_expect(now.load(order) != gen, 0)) {
    buf->busy.store(false, std::memory_order_release);
    return kFast ? on_start_general(fn) : nullptr;
  }
  char* slot;
  if (kFast) {
    slot = buf->cursor;
    buf->cursor += kSlotBytes;
  } else {
    slot = buf->next_slot();
    if (__builtin_expect(slot == nullptr, 0)) {  // no memory for a chunk: not recorded
      buf->busy.store(false, std::memory_order_release);
      count_dropped();
      return nullptr;
    }
  }
  Record* r = slot_record(slot);
  r->name_id = name_id;  // thread_index: filled in by copy_records
  r->seq_nr = fn.seqNr();
  r->fwd_thread_id = uint32_t(fn.forwardThreadId());
  r->rf_thread_id = uint32_t(rf_thread);
  r->shape_offset = kNoShapes;
  // scope, flags, context_held and pad as one store
  uint32_t tail = uint32_t(uint8_t(fn.scope())) | (async << 9) | (uint32_t(1) << 16);
  static_assert(offsetof(Record, flags) == offsetof(Record, scope) + 1 &&
                offsetof(Record, context_held) == offsetof(Record, scope) + 2 &&
                offsetof(Record, pad) == offsetof(Record, scope) + 3 && kFlagAsync == 2,
                "scope, flags, context_held, pad are one word");
  std::memcpy(&r->scope, &tail, sizeof(tail));
  if (kWithInputs && fn.needsInputs()) {
    r->shape_offset = encode_inputs(fn, buf->shapes);
  }
  if (!kFast) {
    if (ts.record_shapes && fn.needsInputs()) {
      r->shape_offset = encode_inputs(fn, buf->shapes);
    }
    if (ts.with_stack) push_stack(ts, *buf);
  }
  Ctx* ctx = new (slot) Ctx();
  r->end_ns = 0;  // 0 until on_end: unfinished
  r->start_ns = kFast ? tsc() : ticks();  // last, so our own work stays outside the range
  buf->busy.store(false, std::memory_order_release);
  return std::unique_ptr<at::ObserverContext>(ctx);
}

// Every case: joining a session, a skipped worker, inputs, stacks, names seen
// for the first time or held by the RecordFunction itself.
std::unique_ptr<at::ObserverContext> on_start_general(const at::RecordFunction& fn) {
  uint64_t gen = g_active_generation.load(std::memory_order_acquire);
  if (gen == 0) return nullptr;
  ThreadState& ts = thread_state_for(fn);
  int32_t id;
  try {  // joining and naming allocate; write_start catches its own
    if (ts.generation != gen) {
      if (!join_session(ts, gen)) return nullptr;
    } else if (ts.skip) {
      return nullptr;
    } else if (ts.fast_key != kNoFastKey) {  // back to on_start_fast after an epoch change
      ts.fast_key = fast_key_of(gen, refresh_schema_names(ts));
    }
    id = name_id(ts, fn, fn.name());
  } catch (const std::bad_alloc&) {
    count_dropped();
    return nullptr;
  }
  return write_start<false>(fn, ts, gen, id, fn.isAsync(), fn.threadId());
}

// Whether fn holds its own name (key, its descriptor_key, then points at it)
// in a std::string buffer, which the fast path looks up by content.
inline bool holds_own_name(const at::RecordFunction& fn, uintptr_t key) {
  return g_variant_index_checks.load(std::memory_order_relaxed) == kIndexConfirmed &&
         variant_index(fn) == 0 && (key & 7) == 0;
}

// The id of fn's name when a cache slot has it, else -1: an operator in its
// schema's second slot, or a name fn holds (autograd nodes, ranges), found in
// the cache by its quick key and checked by content.
__attribute__((always_inline)) inline int32_t cached_name_id(const at::RecordFunction& fn,
                                                              const ThreadState& ts,
                                                              uintptr_t key) {
  if (holds_own_name(fn, key)) {
    size_t size = own_name_size(fn);
    const char* name = reinterpret_cast<const char*>(key);
    NameKey k = name_key(name, size);
    const NameCacheSlot& c = ts.cache[own_name_slot(k, size)];
    return same_name(c, name, size, k) ? c.id : -1;
  }
  size_t pair = key_slot(key) ^ 1;
  return ts.schema_keys[pair] == key ? ts.schema_ids[pair] : -1;
}

// fn's isAsync() flag as 0 or 1: the byte find_async_offset saw go from one
// to the other.
inline uint32_t async_flag(const at::RecordFunction& fn) {
  return reinterpret_cast<const uint8_t*>(&fn)[g_async_offset];
}

// on_start_fast when no cache slot has fn's name: a name fn holds is looked up
// by content and put in its slot; anything else takes on_start_general.
template <bool kWithInputs, bool kLightFence>
__attribute__((noinline)) std::unique_ptr<at::ObserverContext> on_start_uncached(
    const at::RecordFunction& fn, ThreadState& ts) {
  uintptr_t key = descriptor_key(fn);
  if (holds_own_name(fn, key)) {
    size_t size = own_name_size(fn);
    const char* name = reinterpret_cast<const char*>(key);
    NameCacheSlot& c = ts.cache[own_name_slot(name_key(name, size), size)];
    int32_t id;
    try {  // interning a name allocates
      id = name_id_slow(ts, c, name, size);
    } catch (const std::bad_alloc&) {
      count_dropped();
      return nullptr;
    }
    return write_start<true, kWithInputs, kLightFence>(fn, ts, ts.fast_key, id, async_flag(fn),
                                                       fn.threadId());
  }
  return on_start_general(fn);
}

// on_start_fast when the operator's schema is not in its first slot. The
// fast key and the async flag are read again after the lookup, which then
// needs fewer registers (on_start_fast checked that the thread's fast_key is
// the session's).
template <bool kWithInputs, bool kLightFence>
__attribute__((noinline)) std::unique_ptr<at::ObserverContext> on_start_own_name(
    const at::RecordFunction& fn, ThreadState& ts) {
  int32_t id = cached_name_id(fn, ts, descriptor_key(fn));
  if (__builtin_expect(id < 0, 0)) return on_start_uncached<kWithInputs, kLightFence>(fn, ts);
  return write_start<true, kWithInputs, kLightFence>(fn, ts, ts.fast_key, id, async_flag(fn),
                                                     fn.threadId());
}

// The common case, registered when the TSC is the clock and both offsets
// into at::RecordFunction are known: a thread already in a session without
// inputs or stacks, running an operator seen since the last deregistration.
// It reads fn's fields directly and calls nothing. kWithInputs: the session
// records inputs (and no stacks); the inputs are encoded too. kLightFence:
// stop() fences every thread with membarrier (Session::light_fence).
template <bool kWithInputs, bool kLightFence>
std::unique_ptr<at::ObserverContext> on_start_fast(const at::RecordFunction& fn) {
  uintptr_t key = descriptor_key(fn);
  uint64_t fast_key = g_fast_key.load(std::memory_order_acquire);
  uint64_t rf_thread = fn.threadId();
  ThreadState* ts = state_slot(rf_thread).load(std::memory_order_relaxed);
  if (__builtin_expect(ts->self == thread_pointer() && ts->fast_key == fast_key &&
                           ts->buffer->cursor != ts->buffer->limit, 1)) {
    size_t slot = key_slot(key);
    if (__builtin_expect(ts->schema_keys[slot] == key, 1)) {
      return write_start<true, kWithInputs, kLightFence>(fn, *ts, fast_key, ts->schema_ids[slot],
                                                         async_flag(fn), rf_thread);
    }
    return on_start_own_name<kWithInputs, kLightFence>(fn, *ts);
  }
  return on_start_general(fn);
}

// A late end (after stop, or on another thread) still writes into live
// memory: stop() keeps every chunk that holds an open record or a context.
template <bool kTsc>
void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  int64_t t = kTsc ? tsc() : now_ns();
  if (ctx == nullptr) return;
  __atomic_store_n(&context_record(ctx)->end_ns, t, __ATOMIC_RELAXED);
}

// Receives the allocator reports (c10::reportMemoryUsageToProfiler) of the
// thread that started the session, and of threads that inherit its debug info
// (autograd workers). A ProfilerStateBase, because torch reads whatever sits
// under PROFILER_STATE as one; its config says "disabled", so torch.profiler
// still sees no profiler running.
std::atomic<uint64_t> g_memory_generation{0};

void record_memory(void* ptr, int64_t bytes, size_t total_allocated, size_t total_reserved,
                   c10::Device device) {
  uint64_t gen = g_memory_generation.load(std::memory_order_acquire);
  if (gen == 0) return;
  ThreadState& ts = thread_state();
  try {  // called inside the allocator: nothing may escape into it
    if (ts.generation != gen) join_session(ts, gen);
  } catch (const std::bad_alloc&) {
    count_dropped();
    return;
  }
  ThreadBuffer* buf = ts.buffer;
  if (buf == nullptr || ts.generation != gen) return;
  buf->busy.store(true, std::memory_order_seq_cst);
  if (g_memory_generation.load(std::memory_order_seq_cst) == gen) {
    try {
      buf->memory.push_back(MemRecord{ticks(), int64_t(reinterpret_cast<uintptr_t>(ptr)), bytes,
                                      int64_t(total_allocated), int64_t(total_reserved),
                                      buf->index, int8_t(device.type()),
                                      int8_t(device.index()), 0});
    } catch (const std::bad_alloc&) {
      count_dropped();
    }
  }
  buf->busy.store(false, std::memory_order_release);
}

struct MemoryReporter : public torch::profiler::impl::ProfilerStateBase {
  MemoryReporter()
      : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(
            torch::profiler::impl::ProfilerState::Disabled)) {}
  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated,
                         size_t total_reserved, c10::Device device) override {
    record_memory(ptr, alloc_size, total_allocated, total_reserved, device);
  }
  bool memoryProfilingEnabled() const override {
    return g_memory_generation.load(std::memory_order_relaxed) != 0;
  }
  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }
};
std::shared_ptr<MemoryReporter> g_reporter;  // pushed on the starting thread

void push_reporter() {
  g_reporter = std::make_shared<MemoryReporter>();
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, g_reporter);
}

// Pops our reporter when it is on top of this thread's debug info; otherwise
// (stop on another thread, or something pushed above it) it stays, inert.
void pop_reporter() {
  if (!g_reporter) return;
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == g_reporter.get()) {
    try {
      c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
    } catch (const std::exception&) {
    }
  }
  g_reporter.reset();
}

// The callback a forked child inherited from its parent's recording: inert
// there (generation 0) and removed by the child's first start().
at::CallbackHandle g_inherited_handle = 0;

// The asymmetric fence of Session::light_fence: registered once per process
// (a forked child registers again: its mm starts unregistered), and checked
// by one call. False where the kernel lacks it or a sandbox forbids it; the
// handshake then fences on each op.
int g_membarrier_state = 0;  // 0: not tried, 1: ready, -1: unavailable; under g_session_mu
bool membarrier_ready() {
#if defined(__linux__) && defined(SYS_membarrier)
  if (g_membarrier_state == 0) {
    bool ok = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 &&
              syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
    g_membarrier_state = ok ? 1 : -1;
  }
  return g_membarrier_state == 1;
#else
  return false;
#endif
}

// stop()'s half of the light handshake: every running thread of the process
// executes a full fence before this returns.
void fence_all_threads() {
#if defined(__linux__) && defined(SYS_membarrier)
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
#endif
  // Registered and checked at start(): not expected. A thread that read the
  // old generation has its busy flag out of its store buffer long before this.
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void start(bool record_shapes, bool profile_memory, bool with_stack) {
  std::lock_guard<std::mutex> g(g_session_mu);
  if (g_session) {
    throw std::runtime_error("opscope native collector is already recording");
  }
  if (g_inherited_handle != 0) {
    at::removeCallback(g_inherited_handle);
    g_inherited_handle = 0;
  }
  static bool prepared = false;  // once per process, under g_session_mu
  if (!prepared) {
    clear_state_slots();
    g_own_name_offset = find_own_name_offset();
    g_async_offset = find_async_offset();
    // kept for the life of the process: the listener must outlive every cached pointer
    new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().addRegistrationListener(
        std::make_unique<NameEpochListener>()));
    prepared = true;
  }
  auto s = std::make_shared<Session>();
  s->generation = ++g_last_generation;
  s->record_shapes = record_shapes;
  s->with_stack = with_stack;
  g_frame_walk_on = frame_walk_supported();  // published by the generation store below
  g_session = s;
  if (profile_memory) {
    push_reporter();
    g_memory_generation.store(s->generation, std::memory_order_release);
  }
  bool fast = g_use_tsc && g_own_name_offset >= 0 && g_async_offset >= 0 &&
              s->generation < (uint64_t(1) << 32);  // fast_key_of
  s->light_fence = fast && !with_stack && membarrier_ready();
  auto first = !fast || with_stack ? on_start_general
               : s->light_fence ? (record_shapes ? on_start_fast<true, true>
                                                 : on_start_fast<false, true>)
                                : (record_shapes ? on_start_fast<true, false>
                                                 : on_start_fast<false, false>);
  auto cb = at::RecordFunctionCallback(first,
                                       g_use_tsc ? on_end<true> : on_end<false>)
                .needsInputs(record_shapes)
                .needsIds(false);
  g_handle = at::addGlobalCallback(cb);
  g_active_generation.store(s->generation, std::memory_order_release);
  // A listener that bumps the epoch after the check below sees the key and
  // updates it; one that bumped it before makes the loop go round.
  for (uint64_t epoch = ~uint64_t(0); fast;) {
    uint64_t now = g_names_epoch.load(std::memory_order_acquire);
    if (now == epoch) break;
    epoch = now;
    g_fast_key.store(fast_key_of(s->generation, epoch), std::memory_order_seq_cst);
  }
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

// Frees chunk c when all its records have ended: it is never written again.
// A chunk holding an open record stays for its late end.
void free_chunk_if_finished(ThreadBuffer& t, size_t c) {
  char* slots = t.chunks[c].get();
  if (slots == nullptr) return;  // freed before (an earlier stop, or a fork)
  size_t k = t.used_in(c);
  for (size_t i = 0; i < k; ++i) {
    const Record* r = slot_record(slots + i * kSlotBytes);
    if (__atomic_load_n(&r->context_held, __ATOMIC_ACQUIRE) != 0 ||
        __atomic_load_n(&r->end_ns, __ATOMIC_RELAXED) == 0) {
      return;
    }
  }
  t.chunks[c].reset();
}

// Frees the chunks whose records have all ended.
void free_finished_chunks(ThreadBuffer& t) {
  for (size_t c = 0; c < t.chunks.size(); ++c) free_chunk_if_finished(t, c);
}

// Frees what earlier sessions kept for a range still open at their stop
// that has ended since (a chunk is 2 MiB). Only buffers whose stop is done
// are looked at: a running session's last slot may be half written.
void free_chunks_of_ended_ranges() {
  std::lock_guard<std::mutex> g(g_session_mu);
  for (auto& owned : g_all_buffers) {
    if (owned->stopped.load(std::memory_order_acquire)) free_finished_chunks(*owned);
  }
}

// Copies a thread's records out of their slots, a chunk at a time: the
// internal flag is cleared, a record not ended yet (end 0) is flagged
// unfinished, and times become ns while the chunk is in cache. Each chunk
// whose records have all ended is freed once copied, so that the records
// are not held twice at the peak of a long session's stop.
Record* copy_records(ThreadBuffer& t, Record* dst, ClockPoint stop_point) {
  for (size_t c = 0; c < t.chunks.size(); ++c) {
    const char* slots = t.chunks[c].get();
    size_t k = t.used_in(c);
    Record* first = dst;
    for (size_t i = 0; i < k; ++i, ++dst) {
      std::memcpy(dst, slots + i * kSlotBytes + sizeof(Ctx), sizeof(Record));
      dst->thread_index = t.index;
      dst->context_held = 0;
      if (dst->end_ns == 0) dst->flags = uint8_t(dst->flags | kFlagUnfinished);
    }
    to_clock_ns(first, k, stop_point);
    free_chunk_if_finished(t, c);
  }
  return dst;
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

// Stops recording and returns the session as plain bytes (the records as a bytearray):
// (records, shapes_per_thread, thread_os_ids, names, stop_ns, memory, stacks)
// where stacks is None without with_stack (see collect_stacks).
py::tuple stop() {
  std::shared_ptr<Session> s;
  {
    std::lock_guard<std::mutex> g(g_session_mu);
    if (!g_session) {
      throw std::runtime_error("opscope native collector is not recording");
    }
    g_fast_key.store(0, std::memory_order_seq_cst);
    g_active_generation.store(0, std::memory_order_seq_cst);
    g_memory_generation.store(0, std::memory_order_seq_cst);
    at::removeCallback(g_handle);
    s = std::move(g_session);
    g_session.reset();
  }
  pop_reporter();
  free_chunks_of_ended_ranges();
  if (s->light_fence) fence_all_threads();
  std::lock_guard<std::mutex> g(s->mu);
  for (ThreadBuffer* t : s->threads) {
    while (t->busy.load(std::memory_order_acquire)) {
    }
  }
  // After the wait: a record written while stop() ran starts before this point.
  ClockPoint stop_point = clock_point();
  int64_t stop_ns = stop_point.ns;
  size_t total = 0;
  for (ThreadBuffer* t : s->threads) total += t->count();
  // The records go straight into a bytearray (writable, so Python takes it
  // without a copy), uninitialised: every byte is written below.
  py::object blob = py::reinterpret_steal<py::object>(
      PyByteArray_FromStringAndSize(nullptr, Py_ssize_t(total * sizeof(Record))));
  if (!blob) throw py::error_already_set();
  Record* dst = reinterpret_cast<Record*>(PyByteArray_AS_STRING(blob.ptr()));
  // The copy touches no Python object: other Python threads (the job's) run meanwhile,
  // so a black box rotating its window, or a dump, does not stall them for the copy.
  std::vector<std::string> shape_blobs;
  std::string mem_blob;
  {
    py::gil_scoped_release no_gil;
    for (ThreadBuffer* t : s->threads) {
      dst = copy_records(*t, dst, stop_point);
      shape_blobs.push_back(t->shapes.joined());
      t->shapes.release();
      t->stopped.store(true, std::memory_order_release);
    }
    size_t n_mem = 0;
    for (ThreadBuffer* t : s->threads) n_mem += t->memory.size();
    mem_blob.assign(n_mem * sizeof(MemRecord), '\0');
    MemRecord* mem_out = reinterpret_cast<MemRecord*>(&mem_blob[0]);
    for (ThreadBuffer* t : s->threads) {
      std::memcpy(mem_out, t->memory.data(), t->memory.size() * sizeof(MemRecord));
      mem_out += t->memory.size();
      std::vector<MemRecord>().swap(t->memory);
    }
    if (g_use_tsc) {
      MemRecord* m = reinterpret_cast<MemRecord*>(&mem_blob[0]);
      double span = double(stop_point.ticks - g_load_point.ticks);
      double scale = span > 0 ? double(stop_point.ns - g_load_point.ns) / span : 1.0;
      for (size_t i = 0; i < n_mem; ++i) {
        m[i].time_ns =
            g_load_point.ns + int64_t(double(m[i].time_ns - g_load_point.ticks) * scale);
      }
    }
  }
  py::list shapes, tids;
  for (size_t i = 0; i < s->threads.size(); ++i) {
    shapes.append(py::bytes(shape_blobs[i]));
    tids.append(s->threads[i]->os_tid);
  }
  py::object stacks = py::none();
  if (s->with_stack) stacks = collect_stacks(s->threads, total);
  py::list names;
  {
    std::lock_guard<std::mutex> gn(g_names.mu);
    for (const auto& n : g_names.names) names.append(py::str(n));
  }
  return py::make_tuple(blob, shapes, tids, names, stop_ns, py::bytes(mem_blob),
                        stacks);
}

bool is_recording() {
  return g_active_generation.load(std::memory_order_acquire) != 0;
}

// Runs in a forked child (pthread_atfork), where only the forking thread
// exists. The child must not go on recording into its copy of the parent's
// session (nobody would read it), and must be able to start its own. A lock
// that a vanished parent thread held at the fork would stay locked forever,
// so no lock is taken: the locks are rebuilt, the generations zeroed (every
// callback then returns at once), and the copied buffers freed. glibc makes
// malloc usable again before child handlers run. A chunk that still holds an
// open record is kept: that range may end in the child and write its end.
// torch's callback registry is not touched here (its lock could be held);
// the inherited callback is removed by the child's own start().
void after_fork_in_child() {
  g_fast_key.store(0, std::memory_order_relaxed);
  g_membarrier_state = 0;
  g_active_generation.store(0, std::memory_order_relaxed);
  g_memory_generation.store(0, std::memory_order_relaxed);
  new (&g_session_mu) std::mutex();
  new (&g_names.mu) std::mutex();
  g_regions.after_fork();
  if (g_session) {
    new (&g_session->mu) std::mutex();
    g_session.reset();
    g_inherited_handle = g_handle;
    g_handle = 0;
  }
  for (auto& owned : g_all_buffers) {
    ThreadBuffer& t = *owned;
    free_finished_chunks(t);
    t.shapes.release();
    std::vector<MemRecord>().swap(t.memory);
    std::vector<uint32_t>().swap(t.stack_ids);
    std::vector<uint32_t>().swap(t.stack_begin);
    std::vector<uint32_t>().swap(t.stack_frames);
    std::vector<FrameKey>().swap(t.frame_keys);
    std::vector<ResolvedFrame>().swap(t.frame_text);
    t.frame_ids.clear();
    t.stack_by_hash.clear();
    t.busy.store(false, std::memory_order_relaxed);
  }
}

// Bytes of records still held in every thread's chunks (tests: a forked child
// holds almost none). Call only while not recording: chunks grow unlocked.
// -- The black box's fatal dump ---------------------------------------------------------
// On SIGSEGV, SIGBUS, SIGFPE or SIGABRT the black box's ring is written raw, with
// async-signal-safe calls only (open, write, rename, close, clock_gettime, sigaction,
// raise): the finished windows Python registered (set_fatal_windows: record arrays it
// keeps alive) and the live window's records, read from their chunks. Then the signal's
// previous action is put back and the signal raised again, so the process ends as it
// would have. Read by opscope/load/raw_black_box.py. Layout (little-endian):
//   "OPSBBRAW", uint32 version 1, uint32 signal, int64 epoch offset ns, int64 stop ns;
//   then sections: uint32 kind, uint32 0, uint64 payload bytes, payload:
//     kind 1: the name table, each name NUL-terminated, in id order;
//     kind 2: a window: int64 start_ns, int64 stop_ns, uint32 threads, uint32 0,
//             int64 OS thread id per thread, then 48-byte records to the end.
//   The live window is the last kind-2 section; its open records have end_ns 0.
struct FatalWindow {
  const char* records;
  uint64_t count;
  const int64_t* tids;
  uint32_t n_tids;
  int64_t start_ns;
  int64_t stop_ns;
};
constexpr int kMaxFatalWindows = 64;
struct FatalTable {
  FatalWindow windows[kMaxFatalWindows];
  int count = 0;
};
FatalTable g_fatal_tables[2];
// The arrays each table points into. Never destroyed: a static's destructor would run
// after Python's finalisation and release objects of an interpreter that is gone.
std::vector<py::object>* const g_fatal_keep = new std::vector<py::object>[2];
std::atomic<int> g_fatal_current{0};
constexpr int kFatalSignals[4] = {SIGSEGV, SIGBUS, SIGFPE, SIGABRT};
struct sigaction g_fatal_previous[4];
std::atomic<bool> g_fatal_installed{false};
std::atomic<bool> g_fatal_busy{false};
char g_fatal_prefix[4096];
int64_t g_fatal_epoch_offset = 0;
int64_t g_fatal_start_ns = 0;  // the live window's start
constexpr size_t kFatalStageBytes = size_t(1) << 20;
char* g_fatal_stage = nullptr;  // taken at install: a signal handler cannot allocate
size_t g_fatal_staged = 0;
int g_fatal_fd = -1;

bool fatal_write_all(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = write(g_fatal_fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}
bool fatal_flush() {
  bool ok = fatal_write_all(g_fatal_stage, g_fatal_staged);
  g_fatal_staged = 0;
  return ok;
}
bool fatal_put(const void* data, size_t n) {
  if (g_fatal_staged + n > kFatalStageBytes && !fatal_flush()) return false;
  if (n > kFatalStageBytes) return fatal_write_all(data, n);
  std::memcpy(g_fatal_stage + g_fatal_staged, data, n);
  g_fatal_staged += n;
  return true;
}
bool fatal_section(uint32_t kind, uint64_t bytes) {
  uint32_t head[2] = {kind, 0};
  return fatal_put(head, sizeof(head)) && fatal_put(&bytes, sizeof(bytes));
}
size_t fatal_append_number(char* out, uint64_t v) {
  char digits[24];
  size_t n = 0;
  do {
    digits[n++] = char('0' + v % 10);
    v /= 10;
  } while (v > 0);
  for (size_t i = 0; i < n; ++i) out[i] = digits[n - 1 - i];
  return n;
}

void fatal_write_names() {
  uint64_t bytes = 0;
  size_t n = g_names.names.size();
  for (size_t i = 0; i < n; ++i) bytes += g_names.names[i].size() + 1;
  fatal_section(1, bytes);
  for (size_t i = 0; i < n; ++i) fatal_put(g_names.names[i].c_str(), g_names.names[i].size() + 1);
}

void fatal_write_window(const FatalWindow& w) {
  int64_t head[2] = {w.start_ns, w.stop_ns};
  uint32_t threads[2] = {w.n_tids, 0};
  fatal_section(2, 24 + 8 * uint64_t(w.n_tids) + w.count * sizeof(Record));
  fatal_put(head, sizeof(head));
  fatal_put(threads, sizeof(threads));
  fatal_put(w.tids, 8 * size_t(w.n_tids));
  fatal_put(w.records, w.count * sizeof(Record));
}

// The live window: records copied out of their slots, ticks made ns as stop() does.
void fatal_write_live(ClockPoint stop_point) {
  Session* s = g_session.get();  // no lock: a crashing thread cannot wait
  if (s == nullptr) return;
  size_t n_threads = s->threads.size(), total = 0;
  for (size_t i = 0; i < n_threads; ++i) total += s->threads[i]->count();
  int64_t head[2] = {g_fatal_start_ns, stop_point.ns};
  uint32_t threads[2] = {uint32_t(n_threads), 0};
  fatal_section(2, 24 + 8 * uint64_t(n_threads) + total * sizeof(Record));
  fatal_put(head, sizeof(head));
  fatal_put(threads, sizeof(threads));
  for (size_t i = 0; i < n_threads; ++i) fatal_put(&s->threads[i]->os_tid, 8);
  for (size_t i = 0; i < n_threads; ++i) {
    ThreadBuffer& t = *s->threads[i];
    size_t written = 0, count = t.count();
    for (size_t c = 0; c < t.chunks.size() && written < count; ++c) {
      const char* slots = t.chunks[c].get();
      size_t k = std::min(t.used_in(c), count - written);
      for (size_t j = 0; j < k; ++j) {
        Record r;
        std::memcpy(&r, slots + j * kSlotBytes + sizeof(Ctx), sizeof(Record));
        r.thread_index = int32_t(i);
        r.context_held = 0;
        to_clock_ns(&r, 1, stop_point);
        fatal_put(&r, sizeof(r));
      }
      written += k;
    }
  }
}

void fatal_handler(int sig, siginfo_t* info, void*) {
  int saved_errno = errno;
  int which = 0;
  while (which < 3 && kFatalSignals[which] != sig) ++which;
  if (!g_fatal_busy.exchange(true) && g_fatal_installed.load()) {
    ClockPoint stop_point = clock_point();
    char path[4200], final_path[4200];
    size_t n = std::strlen(g_fatal_prefix);
    std::memcpy(path, g_fatal_prefix, n);
    n += fatal_append_number(path + n, uint64_t(stop_point.ns + g_fatal_epoch_offset) / 1000000);
    std::memcpy(path + n, ".raw", 5);
    std::memcpy(final_path, path, n + 5);
    std::memcpy(path + n + 4, ".tmp", 5);
    g_fatal_fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (g_fatal_fd >= 0) {
      g_fatal_staged = 0;
      uint32_t version[2] = {1, uint32_t(sig)};
      int64_t times[2] = {g_fatal_epoch_offset, stop_point.ns};
      bool ok = fatal_put("OPSBBRAW", 8) && fatal_put(version, 8) && fatal_put(times, 16);
      if (ok) {
        fatal_write_names();
        const FatalTable& table = g_fatal_tables[g_fatal_current.load()];
        for (int i = 0; i < table.count; ++i) fatal_write_window(table.windows[i]);
        fatal_write_live(stop_point);
        ok = fatal_flush();
      }
      close(g_fatal_fd);
      if (ok) rename(path, final_path); else unlink(path);
    }
  }
  // As it would have: the previous action back, and the signal again (a fault also
  // comes back by itself when its instruction runs again).
  sigaction(sig, &g_fatal_previous[which], nullptr);
  if (info == nullptr || info->si_code <= 0) raise(sig);
  errno = saved_errno;
}

void install_fatal(const std::string& prefix, int64_t epoch_offset, int64_t start_ns) {
  if (prefix.size() + 64 > sizeof(g_fatal_prefix)) throw std::invalid_argument("path too long");
  std::memcpy(g_fatal_prefix, prefix.c_str(), prefix.size() + 1);
  g_fatal_epoch_offset = epoch_offset;
  g_fatal_start_ns = start_ns;
  if (g_fatal_stage == nullptr) g_fatal_stage = static_cast<char*>(std::malloc(kFatalStageBytes));
  if (g_fatal_stage == nullptr) throw std::bad_alloc();
  if (g_fatal_installed.load()) return;
  stack_t current;
  if (sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE)) {
    static char* alt = static_cast<char*>(std::malloc(size_t(1) << 16));
    stack_t ss{};
    ss.ss_sp = alt;
    ss.ss_size = size_t(1) << 16;
    if (alt != nullptr) sigaltstack(&ss, nullptr);  // a stack overflow still gets a handler
  }
  struct sigaction action{};
  action.sa_sigaction = fatal_handler;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (int i = 0; i < 4; ++i) sigaction(kFatalSignals[i], &action, &g_fatal_previous[i]);
  g_fatal_busy.store(false);
  g_fatal_installed.store(true);
}

void uninstall_fatal() {
  if (!g_fatal_installed.exchange(false)) return;
  g_fatal_tables[0].count = g_fatal_tables[1].count = 0;
  std::vector<py::object>().swap(g_fatal_keep[0]);
  std::vector<py::object>().swap(g_fatal_keep[1]);
  for (int i = 0; i < 4; ++i) {
    struct sigaction now{};
    if (sigaction(kFatalSignals[i], nullptr, &now) == 0 &&
        (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == fatal_handler) {
      sigaction(kFatalSignals[i], &g_fatal_previous[i], nullptr);
    }
  }
}

// windows: (records: a buffer of 48-byte records, tids: int64 buffer, start_ns, stop_ns)
void set_fatal_windows(py::list windows, int64_t live_start_ns) {
  int next = 1 - g_fatal_current.load();
  FatalTable& table = g_fatal_tables[next];
  std::vector<py::object> keep;
  table.count = 0;
  for (py::handle item : windows) {
    if (table.count == kMaxFatalWindows) break;
    py::tuple w = py::reinterpret_borrow<py::tuple>(item);
    py::buffer records = w[0].cast<py::buffer>(), tids = w[1].cast<py::buffer>();
    py::buffer_info r = records.request(), t = tids.request();
    FatalWindow& f = table.windows[table.count++];
    f.records = static_cast<const char*>(r.ptr);
    f.count = uint64_t(r.size * r.itemsize) / sizeof(Record);
    f.tids = static_cast<const int64_t*>(t.ptr);
    f.n_tids = uint32_t(t.size);
    f.start_ns = w[2].cast<int64_t>();
    f.stop_ns = w[3].cast<int64_t>();
    keep.push_back(records);
    keep.push_back(tids);
  }
  g_fatal_keep[next].swap(keep);
  g_fatal_start_ns = live_start_ns;
  g_fatal_current.store(next);
  // the table no longer current keeps its arrays until the next call replaces it
}

int64_t held_record_bytes() {
  std::lock_guard<std::mutex> g(g_session_mu);
  int64_t n = 0;
  for (auto& owned : g_all_buffers) {
    for (auto& chunk : owned->chunks) {
      if (chunk) n += int64_t(kRegionBytes);
    }
  }
  return n;
}

// A user range as a real at::RecordFunction, so every observer sees it. The
// name arrives with its length (pybind11 keeps NULs in a std::string), but
// observers read it as a C string: a NUL is refused here, always, rather
// than cut silently. torch's own fast ranges from compiled code are
// function scope unless they ask for user scope (profiler_flag.py).
int64_t range_push(const std::string& name, bool user_scope) {
  if (name.find('\0') != std::string::npos) {
    throw std::invalid_argument("opscope range_push: name must not contain a NUL character");
  }
  auto rf = std::make_unique<at::RecordFunction>(
      user_scope ? at::RecordScope::USER_SCOPE : at::RecordScope::FUNCTION);
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
