// opscope native observer: user ranges (range_push/range_pop, real RecordFunctions) and the
// empty observer the benchmarks measure torch's own cost with.
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

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
