// opscope native observer: names. The process-wide name table (ids stay valid across sessions)
// and an op's name id: by its schema's pointer, or by content for a name the
// RecordFunction holds, through offsets into at::RecordFunction found once.
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

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
