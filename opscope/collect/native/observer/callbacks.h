// opscope native observer: the RecordFunction callbacks, the per-op path. write_start writes
// a record into its slot; on_start_fast (the common case), on_start_own_name,
// on_start_uncached and on_start_general (every other case) pick its name; on_end
// stamps the end.
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

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
