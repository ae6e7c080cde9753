// opscope execution-trace observer: a global at::RecordFunction callback that
// needs inputs, outputs and ids. It keeps one node per finished op, with the
// identity of every tensor it touched, and hands the nodes to Python
// (take_nodes). Inputs and outputs come already encoded as compact JSON arrays
// (that encoding is most of the work, so it stays in C++); Python lays out the
// nodes and writes the file (opscope/execution_trace/writer.py).
//
// Ids follow the installed torch's ExecutionTraceObserver (kIdScheme, picked
// at build time from kIdSchemes): 1 is the process root, a thread's node gets
// the next id when its first op starts, and outputs are numbered when the op
// ends. Tensors are keyed by their TensorImpl for the whole registration. What
// differs by version is whether an op takes its id before or after its inputs
// are numbered, and how storages are numbered: by their data pointer on the
// shared counter, or (torch 2.8) one id per storage object from a counter of
// their own, so a new storage at a reused address gets a new id. (The JSON
// layout per version is in opscope/execution_trace/writer.py, FORMATS.)
// Not <torch/extension.h>: it brings in torch's whole C++ API, about half of a cold
// build's compile time; this file needs pybind11, the dispatcher and RecordFunction.
#include <pybind11/pybind11.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/version.h>
#include <ATen/core/function_schema.h>
#include <ATen/record_function.h>

#include <atomic>
#include <cmath>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <pthread.h>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

constexpr uint64_t kRootId = 1;
constexpr uint64_t kFirstId = 2;
constexpr uint64_t kFirstStorageId = 1;  // of a separate storage counter

// How one range of torch versions numbers nodes, tensors and storages.
struct IdScheme {
  int since_minor;        // first torch 2.x minor version with this scheme
  bool inputs_first;      // an op's inputs are numbered before the op takes its id
  bool storage_counter;   // one id per storage object, from their own counter
};

// Checked against torch's own observer on 2.4.1, 2.8.0, 2.13.0 and 2.15.0; a
// version in between is assumed to number as the nearest checked one below.
constexpr IdScheme kIdSchemes[] = {
    {4, true, false},   // 2.4: one counter, inputs before the op
    {5, false, true},   // 2.8: the op first; storages counted apart
    {9, false, false},  // 2.13, 2.15: one counter, the op first
};

constexpr IdScheme pick_id_scheme(int minor, size_t k = 0) {
  return k + 1 < sizeof(kIdSchemes) / sizeof(kIdSchemes[0]) && kIdSchemes[k + 1].since_minor <= minor
             ? pick_id_scheme(minor, k + 1)
             : kIdSchemes[k];
}

constexpr IdScheme kIdScheme = pick_id_scheme(TORCH_VERSION_MAJOR > 2 ? 1000 : TORCH_VERSION_MINOR);
// torch stops a list after the element at this index (so keeps 4097 items)
constexpr size_t kMaxListIndex = 4096;
constexpr const char* kThreadNodeName = "[pytorch|profiler|execution_trace|thread]";

// The inputs or the outputs of one node: four JSON arrays, one item per
// input or output, in torch's compact form (no spaces, doubles as "%f").
struct Port {
  std::string values = "[]", shapes = "[]", types = "[]", strides = "[]";
};

struct Node {
  uint64_t id = 0, parent = 0, fw_parent = 0, rf_id = 0, tid = 0, fw_tid = 0;
  int64_t seq_id = -1;
  int64_t scope = 0;
  int32_t schema = -1;  // index into State::schemas, -1: none
  std::string name;
  Port inputs, outputs;
};

struct State {
  std::mutex mu;
  uint64_t generation = 0;  // of the live registration; 0: none
  uint64_t last_generation = 0;
  at::CallbackHandle handle = 0;
  std::atomic<bool> enabled{false};
  uint64_t next_id = kFirstId;
  uint64_t next_storage_id = kFirstStorageId;  // with kIdScheme.storage_counter
  std::unordered_map<uint64_t, std::vector<uint64_t>> stacks;  // per RecordFunction thread id
  std::unordered_map<const void*, uint64_t> object_ids;
  // with kIdScheme.storage_counter: ids by StorageImpl, and a weak reference to
  // each, which keeps its address from being reused by a later storage
  std::unordered_map<const void*, uint64_t> storage_ids;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> seen_storages;
  std::vector<Node> nodes;  // finished, not yet taken by Python
  std::unordered_map<std::string, int32_t> schema_index;
  std::deque<std::string> schemas;

  uint64_t object_id(const void* p) {
    auto it = object_ids.find(p);
    if (it != object_ids.end()) return it->second;
    uint64_t id = next_id++;
    object_ids.emplace(p, id);
    return id;
  }

  uint64_t storage_id(const c10::Storage& storage) {
    if (!kIdScheme.storage_counter) return object_id(storage.data());
    const void* key = storage.unsafeGetStorageImpl();
    auto it = storage_ids.find(key);
    if (it != storage_ids.end()) return it->second;
    uint64_t id = next_storage_id++;
    storage_ids.emplace(key, id);
    seen_storages.push_back(storage.getWeakStorageImpl());
    return id;
  }

  void forget_storages() {
    storage_ids.clear();
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>>().swap(seen_storages);
  }

  void reset() {
    next_id = kFirstId;
    next_storage_id = kFirstStorageId;
    stacks.clear();
    object_ids.clear();
    forget_storages();
    nodes.clear();
  }
};

// Never freed: an op that started under a registration may end after it.
State* const g = new State();

struct OpContext : public at::ObserverContext {
  uint64_t generation = 0;
  uint64_t id = 0, parent = 0, fw_parent = 0, tid = 0;
  std::string name;
  Port inputs;
};

void append_json_string(std::string& out, const std::string& s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          out += "\\u00";
          out += hex[(ch >> 4) & 0xF];
          out += hex[ch & 0xF];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void append_ints(std::string& out, c10::IntArrayRef v) {
  out += '[';
  for (size_t k = 0; k < v.size(); ++k) {
    if (k) out += ',';
    out += std::to_string(v[k]);
  }
  out += ']';
}

// One input or output as JSON text: its value, shape, strides and type (the
// type unquoted: the caller quotes the outermost one).
struct Encoded {
  std::string value, shape, stride, type;
};

// Called with g->mu held: it numbers tensors and storages.
void encode(const c10::IValue& v, Encoded& out) {
  out.type = v.tagKind();
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    bool concrete = !impl->has_symbolic_sizes_strides();
    out.shape = out.stride = "[]";
    if (t.defined() && concrete) {
      out.shape.clear();
      append_ints(out.shape, t.sizes());
      if (t.layout() == at::kStrided) {
        out.stride.clear();
        append_ints(out.stride, t.strides());
      }
    }
    out.type += "(" + std::string(t.dtype().name()) + ")";
    uint64_t tensor_id = g->object_id(impl);
    uint64_t storage_id = 0;
    int64_t offset = 0, numel = 0, itemsize = 0;
    std::string device;
    if (impl->has_storage() && concrete) {
      storage_id = g->storage_id(impl->storage());
      offset = impl->storage_offset();
      numel = impl->numel();
      itemsize = int64_t(impl->itemsize());
      device = impl->device().str();
    }
    out.value = "[" + std::to_string(tensor_id) + "," + std::to_string(storage_id) + "," +
                std::to_string(offset) + "," + std::to_string(numel) + "," +
                std::to_string(itemsize) + ",";
    append_json_string(out.value, device);
    out.value += "]";
    return;
  }
  if (v.isTuple() || v.isList()) {
    std::vector<c10::IValue> elements;
    if (v.isTuple()) {
      const auto& e = v.toTupleRef().elements();
      elements.assign(e.begin(), e.end());
    } else {
      auto list = v.toList();
      for (size_t j = 0; j < list.size(); ++j) {
        elements.push_back(list.get(j));
        if (j >= kMaxListIndex) break;
      }
    }
    out.value = out.shape = out.stride = "[";
    out.type += "[";
    for (size_t j = 0; j < elements.size(); ++j) {
      Encoded item;
      encode(elements[j], item);
      if (j) {
        out.value += ',';
        out.shape += ',';
        out.stride += ',';
        out.type += ',';
      }
      out.value += item.value;
      out.shape += item.shape;
      out.stride += item.stride;
      out.type += item.type;
    }
    out.value += ']';
    out.shape += ']';
    out.stride += ']';
    out.type += ']';
    return;
  }
  out.shape = out.stride = "[]";
  out.value.clear();
  if (v.isDouble()) {
    double d = v.toDouble();
    if (std::isinf(d) || std::isnan(d)) {
      append_json_string(out.value, std::to_string(d));  // JSON has no inf/nan: a string
    } else {
      out.value = std::to_string(d);
    }
  } else if (v.isInt()) {
    out.value = std::to_string(v.toInt());
  } else if (v.isBool()) {
    out.value = v.toBool() ? "true" : "false";
  } else if (v.isString()) {
    append_json_string(out.value, v.toStringRef());
  } else if (v.isDevice()) {
    append_json_string(out.value, v.toDevice().str());
  } else {
    append_json_string(out.value, "<" + std::string(v.tagKind()) + ">");
  }
}

// Encodes values[first:] into a port.
template <typename Values>
void fill_port(const Values& values, size_t first, Port& port) {
  Port p;
  p.values = p.shapes = p.types = p.strides = "[";
  for (size_t i = first; i < values.size(); ++i) {
    Encoded e;
    encode(values[i], e);
    if (i != first) {
      p.values += ',';
      p.shapes += ',';
      p.types += ',';
      p.strides += ',';
    }
    p.values += e.value;
    p.shapes += e.shape;
    append_json_string(p.types, e.type);
    p.strides += e.stride;
  }
  p.values += ']';
  p.shapes += ']';
  p.types += ']';
  p.strides += ']';
  port = std::move(p);
}

int32_t schema_of(const at::RecordFunction& fn) {
  auto op = fn.operator_name();
  if (!op.has_value()) return -1;
  std::string key = op->name + "." + op->overload_name;
  auto it = g->schema_index.find(key);
  if (it != g->schema_index.end()) return it->second;
  auto schema = fn.operator_schema();
  int32_t index = -1;
  if (schema.has_value()) {
    index = int32_t(g->schemas.size());
    g->schemas.push_back(c10::toString(schema.value()));
  }
  g->schema_index.emplace(std::move(key), index);
  return index;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (!g->enabled.load(std::memory_order_acquire)) return nullptr;
  auto ctx = std::make_unique<OpContext>();
  std::lock_guard<std::mutex> lock(g->mu);
  if (g->generation == 0 || !g->enabled.load(std::memory_order_relaxed)) return nullptr;
  uint64_t tid = fn.threadId();
  auto& stack = g->stacks[tid];
  if (stack.empty()) {
    Node thread_node;
    thread_node.id = g->next_id++;
    thread_node.name = kThreadNodeName;
    thread_node.parent = kRootId;
    thread_node.scope = int64_t(at::RecordScope::USER_SCOPE);
    thread_node.tid = tid;
    stack.push_back(thread_node.id);
    g->nodes.push_back(std::move(thread_node));
  }
  ctx->generation = g->generation;
  ctx->tid = tid;
  ctx->name = fn.name();
  ctx->parent = stack.back();
  uint64_t fw_tid = fn.forwardThreadId();
  if (fw_tid != 0) {
    auto fw = g->stacks.find(fw_tid);
    if (fw != g->stacks.end() && !fw->second.empty()) ctx->fw_parent = fw->second.back();
  }
  if (!kIdScheme.inputs_first) ctx->id = g->next_id++;
  try {
    auto inputs = fn.inputs();
    size_t count = fn.num_inputs();
    if (count <= inputs.size()) fill_port(inputs, inputs.size() - count, ctx->inputs);
  } catch (const std::exception&) {
    ctx->inputs = Port();  // an input we cannot describe: keep the node, drop its inputs
  }
  if (kIdScheme.inputs_first) ctx->id = g->next_id++;
  stack.push_back(ctx->id);
  return ctx;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* base) {
  if (base == nullptr) return;
  auto* ctx = static_cast<OpContext*>(base);
  std::lock_guard<std::mutex> lock(g->mu);
  if (ctx->generation != g->generation) return;  // began under an earlier registration
  auto& stack = g->stacks[ctx->tid];
  for (size_t k = stack.size(); k-- > 0;) {
    if (stack[k] == ctx->id) {
      stack.erase(stack.begin() + k);
      break;
    }
  }
  if (!g->enabled.load(std::memory_order_relaxed)) return;  // as torch: ended after stop()
  Node node;
  node.id = ctx->id;
  node.parent = ctx->parent;
  node.fw_parent = ctx->fw_parent;
  node.rf_id = fn.handle();
  node.tid = ctx->tid;
  node.fw_tid = fn.forwardThreadId();
  node.seq_id = fn.seqNr();
  node.scope = int64_t(fn.scope());
  node.name = std::move(ctx->name);
  node.inputs = std::move(ctx->inputs);
  try {
    const auto& outputs = fn.outputs();
    size_t count = fn.num_outputs();
    if (count <= outputs.size()) fill_port(outputs, outputs.size() - count, node.outputs);
    node.schema = schema_of(fn);
  } catch (const std::exception&) {
    node.outputs = Port();
  }
  g->nodes.push_back(std::move(node));
}

// -- Python interface ------------------------------------------------------------

bool register_observer() {
  std::lock_guard<std::mutex> lock(g->mu);
  if (g->generation != 0) return false;
  g->reset();
  g->generation = ++g->last_generation;
  g->enabled.store(false, std::memory_order_release);
  g->handle = at::addGlobalCallback(at::RecordFunctionCallback(on_enter, on_exit)
                                        .needsInputs(true)
                                        .needsOutputs(true)
                                        .needsIds(true));
  at::disableCallback(g->handle);
  return true;
}

void enable() {
  std::lock_guard<std::mutex> lock(g->mu);
  if (g->generation == 0) throw std::runtime_error("execution trace observer is not registered");
  g->enabled.store(true, std::memory_order_release);
  at::reenableCallback(g->handle);
}

void disable() {
  std::lock_guard<std::mutex> lock(g->mu);
  if (g->generation == 0) return;
  g->enabled.store(false, std::memory_order_release);
  at::disableCallback(g->handle);
}

void unregister_observer() {
  std::lock_guard<std::mutex> lock(g->mu);
  if (g->generation == 0) return;
  g->enabled.store(false, std::memory_order_release);
  at::removeCallback(g->handle);
  g->handle = 0;
  g->generation = 0;
  std::vector<Node>().swap(g->nodes);
  g->stacks.clear();
  g->object_ids.clear();
  g->forget_storages();
}

bool is_registered() {
  std::lock_guard<std::mutex> lock(g->mu);
  return g->generation != 0;
}

py::object text(const std::string& s) {
  // op and range names are normally UTF-8; never fail on one that is not
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "replace");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

py::tuple port_to_python(const Port& p) {
  return py::make_tuple(text(p.values), text(p.shapes), text(p.types), text(p.strides));
}

// Finished nodes since the last call, in the order they finished, as tuples:
// (id, name, parent, rf_id, fw_parent, seq_id, scope, tid, fw_tid, op_schema,
//  (in values, shapes, types, strides), (out values, shapes, types, strides)),
// each of the last eight a JSON array as text.
py::list take_nodes() {
  std::vector<Node> nodes;
  std::vector<std::string> schemas;
  {
    std::lock_guard<std::mutex> lock(g->mu);
    nodes.swap(g->nodes);
    schemas.assign(g->schemas.begin(), g->schemas.end());
  }
  std::vector<py::object> schema_text(schemas.size());
  py::str no_schema("");
  py::list out(nodes.size());
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    py::object schema = no_schema;
    if (n.schema >= 0) {
      py::object& cached = schema_text[size_t(n.schema)];
      if (!cached) cached = text(schemas[size_t(n.schema)]);
      schema = cached;
    }
    out[k] = py::make_tuple(n.id, text(n.name), n.parent, n.rf_id, n.fw_parent, n.seq_id,
                            n.scope, n.tid, n.fw_tid, schema, port_to_python(n.inputs),
                            port_to_python(n.outputs));
  }
  return out;
}

// In a forked child (pthread_atfork) only the forking thread exists: the child
// must not go on recording nodes nobody reads. No lock is taken (a vanished
// parent thread may hold it); the lock is rebuilt and the copied nodes freed.
// The registration stays: its callback is inert while `enabled` is false, and
// the parent's file is left to the parent (opscope.execution_trace forgets it).
void after_fork_in_child() {
  g->enabled.store(false, std::memory_order_relaxed);
  new (&g->mu) std::mutex();
  std::vector<Node>().swap(g->nodes);
  g->stacks.clear();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pthread_atfork(nullptr, nullptr, &after_fork_in_child);
  m.def("register_observer", &register_observer,
        "Add the (disabled) callback; False when one is already registered");
  m.def("unregister_observer", &unregister_observer, "Remove the callback and forget all ids");
  m.def("enable", &enable, "Start recording nodes");
  m.def("disable", &disable, "Stop recording nodes");
  m.def("is_registered", &is_registered);
  m.def("take_nodes", &take_nodes, "Finished nodes since the last call, oldest first");
  m.attr("ROOT_ID") = py::int_(kRootId);
}
