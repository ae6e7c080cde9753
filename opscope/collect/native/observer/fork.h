// opscope native observer: fork. The pthread_atfork child handler: a forked child stops
// recording its copy of the parent's session and frees what it copied.
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

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
