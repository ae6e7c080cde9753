// opscope native observer: the clock. Timestamps are TSC ticks where the CPU has an invariant
// TSC, else CLOCK_MONOTONIC ns; a ClockPoint pairs the two (stop() converts).
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

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
