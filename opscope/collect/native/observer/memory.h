// opscope native observer: profile_memory. Allocator reports (MemRecord) received through a
// ProfilerStateBase pushed on the starting thread.
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

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
