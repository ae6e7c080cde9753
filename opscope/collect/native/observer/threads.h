// opscope native observer: each thread's state (ThreadState: its buffer and name caches),
// found per op through torch's thread number; the names epoch and the fast key that
// on_start_fast checks; joining a session.
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

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
