// opscope native observer: a session's start and stop. start() registers the callbacks;
// stop() removes them, waits for writers, and copies the records out as bytes.
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

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

// Bytes of records still held in every thread's chunks (tests: a forked child
// holds almost none). Call only while not recording: chunks grow unlocked.
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
