// opscope native observer: the black box's fatal dump: a signal handler that writes the ring
// raw with async-signal-safe calls only (read by opscope/load/raw_black_box.py).
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

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
