// opscope native observer: records and regions. The layouts a session keeps (Record, MemRecord,
// the frame keys of stacks), the slots records and their contexts live in, the 2 MiB
// regions (RegionPool) that hold them and the encoded inputs (InputWords), each
// thread's ThreadBuffer, and the Session that owns them.
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

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
