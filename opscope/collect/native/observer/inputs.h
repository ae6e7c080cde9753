// opscope native observer: record_shapes' inputs, encoded in place as int64 words (read by
// model/records.py:decode_inputs).
// Part of observer.cpp's one translation unit: included there, inside its anonymous
// namespace, after the headers listed before it (it uses what they define).

#pragma once

// Input encoding, one entry per input, read by model/records.py:decode_inputs.
//   0: none/other   1: tensor [ndim, sizes..., strides..., dtype]
//   2: int [value]  3: double [bits]  4: bool [value]
//   5: tensor list [count]  6: int list [count, values...]  7: string
//
// An op's words are written through a local cursor (InputRun) into room
// reserved once: kInputWordsInline words for each input, the most a tensor
// of up to kInlineDims dims, a scalar, a string or a tensor list takes.
// Before input i there is always room for (inputs - i) such inputs: one that
// takes more (a tensor of more dims, an int or bool list) asks for its own
// words plus that room for the inputs after it (InputRun::room). Nothing is
// pushed word by word.
constexpr int64_t kInlineDims = C10_SIZES_AND_STRIDES_MAX_INLINE_SIZE;
constexpr size_t kInputWordsInline = 3 + 2 * kInlineDims;  // the most a common input takes

// Passed by value to out-of-line helpers (and returned), so that the cursor
// stays in a register on the common path.
struct InputRun {
  InputWords* out;
  int64_t* start;  // the first word not yet committed
  int64_t* w;  // the next word
  int64_t* end;  // the end of the reserved room

  InputRun(InputWords& o, size_t need) : out(&o) {
    start = w = out->reserve(need);
    end = out->end;
  }
  // Room for need more words (commits what is written when it must grow).
  void room(size_t need) {
    if (__builtin_expect(size_t(end - w) < need, 0)) {
      out->commit(size_t(w - start));
      start = w = out->reserve(need);
      end = out->end;
    }
  }
  void finish() { out->commit(size_t(w - start)); }
};

// Copies n words: up to five (torch's inline dims) without a loop or a call.
inline void copy_dims(int64_t* to, const int64_t* from, int64_t n) {
  switch (n) {
    case 5: to[4] = from[4]; [[fallthrough]];
    case 4: to[3] = from[3]; [[fallthrough]];
    case 3: to[2] = from[2]; [[fallthrough]];
    case 2: to[1] = from[1]; [[fallthrough]];
    case 1: to[0] = from[0]; [[fallthrough]];
    case 0: break;
    default: std::memcpy(to, from, size_t(n) * sizeof(int64_t));
  }
}

// TensorImpl's sizes and strides, read as its own inline accessors read them
// (sizes(), strides()), through members it keeps protected: a pointer to a
// protected member, formed in a derived class's scope, is legal C++.
struct TensorImplPeek : c10::TensorImpl {
  // Whether sizes and strides are both torch's own (no subclass overrides them).
  static bool default_sizes_strides(const c10::TensorImpl& t) {
    return !(t.*(&TensorImplPeek::matches_policy))(SizesStridesPolicy::CustomStrides);
  }
  static const c10::impl::SizesAndStrides& sizes_and_strides(const c10::TensorImpl& t) {
    return t.*(&TensorImplPeek::sizes_and_strides_);
  }
};

// A tensor outside encode_tensor's common case (more dims than fit inline,
// another layout, sizes or strides a subclass computes), through TensorImpl's
// public accessors.
__attribute__((noinline)) InputRun encode_tensor_general(const c10::TensorImpl* impl, InputRun run,
                                                         size_t inputs_left) {
  c10::IntArrayRef size_list = impl->sizes();  // its length is dim()
  const int64_t* sizes = size_list.data();
  int64_t nd = int64_t(size_list.size());
  if (__builtin_expect(nd > kInlineDims, 0)) {
    run.room(size_t(3 + 2 * nd) + inputs_left * kInputWordsInline);
  }
  int64_t* w = run.w;
  w[0] = 1;
  w[1] = nd;
  copy_dims(w + 2, sizes, nd);
  if (impl->layout() == at::kStrided) {
    copy_dims(w + 2 + nd, impl->strides().data(), nd);
  } else {
    for (int64_t i = 0; i < nd; ++i) w[2 + nd + i] = 0;
  }
  w[2 + 2 * nd] = int64_t(c10::typeMetaToScalarType(impl->dtype()));
  run.w = w + 3 + 2 * nd;
  return run;
}

// A tensor: [1, ndim, sizes..., strides..., dtype], or [0] when undefined.
// inputs_left: how many inputs follow, whose room is kept. The common case (a
// strided tensor whose sizes and strides torch keeps inline) copies all
// kInlineDims words of each: the words past ndim lie inside torch's inline
// array, and land inside this input's room, where the strides and the dtype,
// or the next input, overwrite them.
inline void encode_tensor(const at::Tensor& t, InputRun& run, size_t inputs_left) {
  if (!t.defined()) {
    *run.w++ = 0;
    return;
  }
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (__builtin_expect(TensorImplPeek::default_sizes_strides(*impl), 1)) {
    const c10::impl::SizesAndStrides& dims = TensorImplPeek::sizes_and_strides(*impl);
    size_t nd = dims.size();
    if (__builtin_expect(nd <= size_t(kInlineDims) && impl->layout() == at::kStrided, 1)) {
      static_assert(kInputWordsInline >= 2 + 2 * kInlineDims + 1, "the copies fit the room");
      const int64_t* sizes = dims.sizes_data();  // read before any word is written
      const int64_t* strides = dims.strides_data();
      int64_t dtype = int64_t(c10::typeMetaToScalarType(impl->dtype()));
      int64_t* w = run.w;
      w[0] = 1;
      w[1] = int64_t(nd);
      std::memcpy(w + 2, sizes, sizeof(int64_t) * kInlineDims);
      std::memcpy(w + 2 + nd, strides, sizeof(int64_t) * kInlineDims);
      w[2 + 2 * nd] = dtype;
      run.w = w + 3 + 2 * nd;
      return;
    }
  }
  run = encode_tensor_general(impl, run, inputs_left);
}

// An IValue's 8-byte payload (its first member): an int's value, a double's
// bits, a list's ListImpl.
static_assert(sizeof(c10::IValue) == 16, "IValue: an 8-byte payload, then its tag");
inline int64_t payload_word(const c10::IValue& v) {
  int64_t w;
  std::memcpy(&w, static_cast<const void*>(&v), sizeof(w));
  return w;
}

// What a list holds: its element type's kind is what isTensorList() and
// isIntList() test first; another kind is told by torch's own checks, as
// before.
enum class ListKind { kOther, kTensor, kInt, kBool };
__attribute__((noinline, cold)) ListKind list_kind_by_torch(const c10::IValue& v) {
  if (v.isTensorList()) return ListKind::kTensor;
  if (v.isIntList()) return ListKind::kInt;
  if (v.isBoolList()) return ListKind::kBool;
  return ListKind::kOther;
}
inline ListKind list_kind(const c10::IValue& v, const c10::detail::ListImpl& list) {
  c10::TypeKind kind = list.elementType->kind();
  if (kind == c10::TypeKind::TensorType) return ListKind::kTensor;
  if (kind == c10::TypeKind::IntType) return ListKind::kInt;
  if (kind == c10::TypeKind::BoolType) return ListKind::kBool;
  return list_kind_by_torch(v);
}

// A bool list's elements as 0/1 (e.g. output_mask).
__attribute__((noinline, cold)) void put_bools(int64_t* w, const c10::IValue* items, size_t n) {
  for (size_t i = 0; i < n; ++i) w[i] = items[i].toBool() ? 1 : 0;
}

// A list: [5, count] for tensors, [6, count, values...] for ints and bools,
// else [0]; its elements are read in place (no list handle copied, no
// refcount). inputs_left: how many inputs follow, whose room is kept.
void encode_list(const c10::IValue& v, InputRun& run, size_t inputs_left) {
  const auto& list = *static_cast<const c10::detail::ListImpl*>(
      reinterpret_cast<const c10::intrusive_ptr_target*>(payload_word(v)));
  ListKind kind = list_kind(v, list);
  size_t n = list.list.size();
  if (kind == ListKind::kTensor) {
    run.w[0] = 5;
    run.w[1] = int64_t(n);
    run.w += 2;
  } else if (kind == ListKind::kInt || kind == ListKind::kBool) {
    run.room(2 + n + inputs_left * kInputWordsInline);
    int64_t* w = run.w;
    w[0] = 6;
    w[1] = int64_t(n);
    const c10::IValue* items = list.list.data();
    if (kind == ListKind::kInt) {
      for (size_t i = 0; i < n; ++i) w[2 + i] = payload_word(items[i]);
    } else {
      put_bools(w + 2, items, n);
    }
    run.w = w + 2 + n;
  } else {
    *run.w++ = 0;
  }
}

// encode_inputs' body: one run of words for fn's inputs; throws
// std::bad_alloc when a chunk for them cannot be had. Out of line, so that
// the handler in encode_inputs costs this loop nothing.
__attribute__((noinline)) void encode_input_run(const at::RecordFunction& fn, InputWords& out) {
  c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
  size_t n = inputs.size();
  InputRun run(out, 1 + n * kInputWordsInline);
  *run.w++ = int64_t(n);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = inputs[i];
    int64_t* w = run.w;
    if (v.isTensor()) {
      encode_tensor(v.toTensor(), run, n - i - 1);
    } else if (v.isInt()) {
      w[0] = 2;
      w[1] = payload_word(v);
      run.w = w + 2;
    } else if (v.isList()) {
      encode_list(v, run, n - i - 1);
    } else if (v.isDouble()) {
      w[0] = 3;
      w[1] = payload_word(v);  // the double's bits
      run.w = w + 2;
    } else if (v.isBool()) {
      w[0] = 4;
      w[1] = v.toBool() ? 1 : 0;
      run.w = w + 2;
    } else if (v.isString()) {
      *run.w++ = 7;
    } else {  // None and anything else
      *run.w++ = 0;
    }
  }
  run.finish();
}

// Returns where fn's inputs start in out, or kNoShapes when they could not
// be encoded (no memory for a chunk; an input torch refuses to describe): the
// op is still recorded, the words written so far are left unreferenced.
__attribute__((noinline)) uint32_t encode_inputs(const at::RecordFunction& fn,
                                                 InputWords& out) {
  try {
    uint32_t offset = uint32_t(out.size);
    encode_input_run(fn, out);
    return offset;
  } catch (const std::exception&) {
    count_dropped();
    return kNoShapes;
  }
}
