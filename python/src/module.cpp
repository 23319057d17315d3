// nvfp4moe._core: the nanobind extension behind the nvfp4moe Python package.
//
// A thin layer over the C++ API (include/nvfp4moe/*.h). Tensors come in through DLPack (nb::ndarray: NumPy,
// CuPy, JAX, ...) or, for torch.Tensor, through a fast path that reads data_ptr/shape/stride/dtype/device
// straight off the tensor object (torch's __dlpack__ is a Python method that costs microseconds per tensor,
// which would dominate a T=1 decode call). Nothing is copied: every TensorRef points at the caller's memory.
//
// Errors: nvfp4moe::ArgumentError -> ValueError, nvfp4moe::FormatError -> nvfp4moe.FormatError (a ValueError
// subclass), other nvfp4moe::Error -> RuntimeError, dtype problems found here -> TypeError.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/error.h"
#include "nvfp4moe/moe.h"
#include "nvfp4moe/spec.h"
#include "nvfp4moe/tensor.h"

#if __has_include("model/synthetic.h")
#include "model/synthetic.h"
#define NVFP4MOE_PY_HAVE_SYNTHETIC 1
#endif

namespace nb = nanobind;
using namespace nb::literals;
using nvfp4moe::DeviceType;
using nvfp4moe::DType;
using nvfp4moe::TensorRef;

namespace {

PyObject* g_format_error = nullptr;  // nvfp4moe.FormatError (subclass of ValueError)

[[noreturn]] void raise_type_error(const std::string& msg) { throw nb::type_error(msg.c_str()); }
[[noreturn]] void raise_value_error(const std::string& msg) { throw nb::value_error(msg.c_str()); }

// ------------------------------------------------------------------------------------------- torch fast path
// Looked up lazily, once torch has been imported by someone (this module never imports torch itself).
struct TorchCache {
  bool ready = false;
  PyTypeObject* tensor_type = nullptr;
  std::vector<std::pair<PyObject*, DType>> dtypes;  // torch.dtype objects (immortal for the process)
  nb::object raw_stream;                            // torch._C._cuda_getCurrentRawStream (or None)
};
TorchCache g_torch;

bool torch_tensor_type_ready() {
  if (g_torch.ready) return true;
  PyObject* modules = PyImport_GetModuleDict();  // borrowed
  PyObject* torch = PyDict_GetItemString(modules, "torch");  // borrowed; null while torch is not imported
  if (!torch) return false;
  nb::handle t(torch);
  if (!nb::hasattr(t, "Tensor") || !nb::hasattr(t, "bfloat16")) return false;  // torch is mid-import
  nb::object tensor = t.attr("Tensor");
  g_torch.tensor_type = reinterpret_cast<PyTypeObject*>(tensor.release().ptr());
  const std::pair<const char*, DType> names[] = {
      {"bfloat16", DType::BF16}, {"float32", DType::F32}, {"float16", DType::F16}, {"int32", DType::I32},
      {"int64", DType::I64},     {"uint8", DType::U8},    {"int8", DType::I8},     {"bool", DType::BOOL},
      {"float8_e4m3fn", DType::F8_E4M3}, {"float8_e5m2", DType::F8_E5M2}};
  for (const auto& [name, dt] : names)
    if (nb::hasattr(t, name)) g_torch.dtypes.emplace_back(nb::object(t.attr(name)).release().ptr(), dt);
  nb::object cmod = t.attr("_C");
  g_torch.raw_stream = nb::hasattr(cmod, "_cuda_getCurrentRawStream") ? cmod.attr("_cuda_getCurrentRawStream")
                                                                       : nb::none();
  g_torch.ready = true;
  return true;
}

bool is_torch_tensor(nb::handle o) {
  return torch_tensor_type_ready() && PyObject_TypeCheck(o.ptr(), g_torch.tensor_type);
}


void int_tuple(nb::handle tup, std::vector<int64_t>& v) {
  const Py_ssize_t n = PyTuple_Size(tup.ptr());
  if (n < 0) throw nb::python_error();
  v.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(tup.ptr(), i));
    if (x == -1 && PyErr_Occurred()) throw nb::python_error();
    v[static_cast<size_t>(i)] = x;
  }
}

std::string py_str(nb::handle o) {
  nb::object s = nb::steal(PyObject_Str(o.ptr()));
  if (!s.is_valid()) throw nb::python_error();
  const char* c = PyUnicode_AsUTF8(s.ptr());
  if (!c) throw nb::python_error();
  return c;
}

std::string pytype_name(nb::handle o) { return py_str(nb::type_name(o.type())); }

// forward's `stream`: a cudaStream_t as a Python int (what torch.cuda.Stream.cuda_stream gives); anything else is
// refused naming the argument (nb::cast alone throws a bare std::bad_cast for -1 or a non-int).
void* stream_arg(nb::handle stream) {
  if (!nb::isinstance<nb::int_>(stream) || nb::isinstance<nb::bool_>(stream))
    raise_type_error(nvfp4moe::detail::cat("stream: expected a cudaStream_t as an int (or None), got ",
                                           pytype_name(stream)));
  uintptr_t v = 0;
  if (!nb::try_cast<uintptr_t>(stream, v, false))
    raise_value_error(nvfp4moe::detail::cat("stream: expected a cudaStream_t as an int in [0, 2^64), got ",
                                            py_str(stream)));
  return reinterpret_cast<void*>(v);
}

// An integer argument taken as a Python object: one past the C++ type (max_tokens=2**63, layer=2**40) is a
// ValueError naming the argument and the range, where nanobind's own cast gave only "incompatible function
// arguments". Anything nanobind's int64_t cast takes (int, numpy integers) is accepted; a bool is refused.
int64_t int_arg(nb::handle v, const char* name, int64_t lo, int64_t hi) {
  if (nb::isinstance<nb::bool_>(v) || !PyIndex_Check(v.ptr()))
    raise_type_error(nvfp4moe::detail::cat(name, ": expected an int, got ", pytype_name(v)));
  int64_t x = 0;
  if (!nb::try_cast<int64_t>(v, x, true) || x < lo || x > hi)
    raise_value_error(nvfp4moe::detail::cat(name, ": expected an int in [", lo, ", ", hi, "], got ", py_str(v)));
  return x;
}

bool truthy(const nb::object& o) {
  const int r = PyObject_IsTrue(o.ptr());
  if (r < 0) throw nb::python_error();
  return r != 0;
}

std::string allowed_text(std::initializer_list<DType> allowed) {
  std::string want;
  for (DType d : allowed) want += (want.empty() ? "" : " or ") + std::string(nvfp4moe::dtype_name(d));
  return want;
}

// Interned attribute names (created once; PyObject_GetAttrString would build a new str per call).
struct Names {
  PyObject *dtype, *is_cuda, *is_cpu, *get_device, *shape, *stride, *data_ptr, *device;
};
const Names& names() {
  static const Names n = {PyUnicode_InternFromString("dtype"),    PyUnicode_InternFromString("is_cuda"),
                          PyUnicode_InternFromString("is_cpu"),   PyUnicode_InternFromString("get_device"),
                          PyUnicode_InternFromString("shape"),    PyUnicode_InternFromString("stride"),
                          PyUnicode_InternFromString("data_ptr"), PyUnicode_InternFromString("device")};
  return n;
}

nb::object getattr_fast(nb::handle o, PyObject* name) {
  PyObject* r = PyObject_GetAttr(o.ptr(), name);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}
nb::object call_method0(nb::handle o, PyObject* name) {
  PyObject* r = PyObject_CallMethodNoArgs(o.ptr(), name);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}
int64_t as_int64(nb::handle o) {
  const long long x = PyLong_AsLongLong(o.ptr());
  if (x == -1 && PyErr_Occurred()) throw nb::python_error();
  return x;
}

void torch_ref(nb::handle t, const char* name, TensorRef& ref, std::initializer_list<DType> allowed) {
  const Names& n = names();
  nb::object dt = getattr_fast(t, n.dtype);
  bool found = false;
  for (const auto& [obj, d] : g_torch.dtypes)
    if (obj == dt.ptr()) { ref.dtype = d; found = true; break; }
  if (!found)
    raise_type_error(nvfp4moe::detail::cat(name, ": expected dtype ", allowed_text(allowed), ", got ", py_str(dt)));
  if (truthy(getattr_fast(t, n.is_cuda))) {
    ref.device = DeviceType::CUDA;
    ref.device_id = static_cast<int>(as_int64(call_method0(t, n.get_device)));
  } else if (truthy(getattr_fast(t, n.is_cpu))) {
    ref.device = DeviceType::CPU;
    ref.device_id = 0;
  } else {
    raise_value_error(nvfp4moe::detail::cat(name, ": expected a cpu or cuda tensor, got a tensor on ",
                                            py_str(getattr_fast(t, n.device))));
  }
  int_tuple(getattr_fast(t, n.shape), ref.shape);
  int_tuple(call_method0(t, n.stride), ref.strides);
  ref.data = PyLong_AsVoidPtr(call_method0(t, n.data_ptr).ptr());
  if (!ref.data && PyErr_Occurred()) throw nb::python_error();
}

// ------------------------------------------------------------------------------------------- buffer path
// NumPy (and any buffer-protocol exporter) through PyObject_GetBuffer: no DLPack capsule, no allocation.
struct BufferGuard {
  Py_buffer view{};
  bool held = false;
  BufferGuard() = default;
  BufferGuard(const BufferGuard&) = delete;
  BufferGuard& operator=(const BufferGuard&) = delete;
  ~BufferGuard() { release(); }
  void release() {
    if (held) PyBuffer_Release(&view);
    held = false;
  }
};

bool buffer_dtype(const char* fmt, Py_ssize_t itemsize, DType* out) {
  if (!fmt) fmt = "B";
  if (*fmt == '<' || *fmt == '=' || *fmt == '@') ++fmt;  // little-endian / native only
  if (fmt[0] == 0 || fmt[1] != 0) return false;
  switch (fmt[0]) {
    case 'f': *out = DType::F32; return itemsize == 4;
    case 'e': *out = DType::F16; return itemsize == 2;
    case 'b': *out = DType::I8; return itemsize == 1;
    case 'B': *out = DType::U8; return itemsize == 1;
    case '?': *out = DType::BOOL; return itemsize == 1;
    case 'i': case 'l': case 'q':
      if (itemsize == 4) { *out = DType::I32; return true; }
      if (itemsize == 8) { *out = DType::I64; return true; }
      return false;
    default: return false;
  }
}

// Returns false (with no Python error set) when o has no usable buffer; the caller then tries DLPack.
bool buffer_ref(nb::handle o, const char* name, TensorRef& ref, BufferGuard& g, bool writable) {
  if (!PyObject_CheckBuffer(o.ptr())) return false;
  if (PyObject_GetBuffer(o.ptr(), &g.view, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    if (writable && PyObject_GetBuffer(o.ptr(), &g.view, PyBUF_RECORDS_RO) == 0) {
      PyBuffer_Release(&g.view);
      raise_value_error(nvfp4moe::detail::cat(name, ": expected a writable array, got a read-only ", pytype_name(o)));
    }
    PyErr_Clear();
    return false;
  }
  g.held = true;
  if (!buffer_dtype(g.view.format, g.view.itemsize, &ref.dtype)) {
    g.release();
    return false;  // the DLPack path reports the dtype
  }
  const int nd = g.view.ndim;
  ref.shape.resize(static_cast<size_t>(nd));
  ref.strides.resize(static_cast<size_t>(nd));
  for (int i = 0; i < nd; ++i) {
    ref.shape[static_cast<size_t>(i)] = g.view.shape[i];
    const Py_ssize_t st = g.view.strides ? g.view.strides[i] : 0;
    if (st % g.view.itemsize != 0) {
      g.release();
      return false;
    }
    ref.strides[static_cast<size_t>(i)] = st / g.view.itemsize;
  }
  if (!g.view.strides && nd > 0) ref.strides.clear();  // contiguous
  ref.device = DeviceType::CPU;
  ref.device_id = 0;
  ref.data = g.view.buf;
  return true;
}

// ------------------------------------------------------------------------------------------- DLPack path
bool dlpack_dtype(const nb::dlpack::dtype& d, DType* out) {
  using code = nb::dlpack::dtype_code;
  if (d.lanes != 1) return false;
  switch (static_cast<code>(d.code)) {
    case code::Int:
      if (d.bits == 8) { *out = DType::I8; return true; }
      if (d.bits == 32) { *out = DType::I32; return true; }
      if (d.bits == 64) { *out = DType::I64; return true; }
      return false;
    case code::UInt:
      if (d.bits == 8) { *out = DType::U8; return true; }
      return false;
    case code::Float:
      if (d.bits == 16) { *out = DType::F16; return true; }
      if (d.bits == 32) { *out = DType::F32; return true; }
      return false;
    case code::Bfloat:
      if (d.bits == 16) { *out = DType::BF16; return true; }
      return false;
    case code::Bool:
      *out = DType::BOOL;
      return true;
    default:
      return false;
  }
}

void expect_dtype(const char* name, const TensorRef& ref, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (ref.dtype == d) return;
  raise_type_error(nvfp4moe::detail::cat(name, ": expected dtype ", allowed_text(allowed), ", got ", nvfp4moe::dtype_name(ref.dtype),
                                         " (", ref.describe(), ")"));
}

// Fills ref from any tensor object. keep holds the imported ndarray alive until the call returns.
// Returns true for a torch.Tensor.
struct Keep {  // what keeps one converted argument's memory alive until the call returns
  nb::ndarray<> array;
  BufferGuard buffer;
};

bool to_ref(nb::handle o, const char* name, TensorRef& ref, Keep& keep, std::initializer_list<DType> allowed,
            bool writable = false) {
  if (is_torch_tensor(o)) {
    torch_ref(o, name, ref, allowed);
    expect_dtype(name, ref, allowed);
    return true;
  }
  if (buffer_ref(o, name, ref, keep.buffer, writable)) {
    expect_dtype(name, ref, allowed);
    return false;
  }
  if (!nb::try_cast<nb::ndarray<>>(o, keep.array, false))
    raise_type_error(nvfp4moe::detail::cat(name, ": expected a tensor (torch, NumPy, CuPy, JAX or any DLPack "
                                           "array), got ", pytype_name(o)));
  if (!dlpack_dtype(keep.array.dtype(), &ref.dtype)) {
    static const char* codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
    const auto d = keep.array.dtype();
    raise_type_error(nvfp4moe::detail::cat(name, ": expected dtype ", allowed_text(allowed), ", got ",
                                           d.code < 7 ? codes[d.code] : "code", int(d.bits),
                                           d.lanes != 1 ? "xN" : "", " (", pytype_name(o), ")"));
  }
  const int dev = keep.array.device_type();
  if (dev == nb::device::cpu::value) {
    ref.device = DeviceType::CPU;
    ref.device_id = 0;
  } else if (dev == nb::device::cuda::value || dev == nb::device::cuda_managed::value) {
    ref.device = DeviceType::CUDA;
    ref.device_id = keep.array.device_id();
  } else {
    raise_value_error(nvfp4moe::detail::cat(name, ": expected a cpu or cuda array, got DLPack device type ", dev,
                                            " from ", pytype_name(o)));
  }
  const size_t nd = keep.array.ndim();
  ref.shape.resize(nd);
  ref.strides.resize(nd);
  for (size_t i = 0; i < nd; ++i) {
    ref.shape[i] = static_cast<int64_t>(keep.array.shape(i));
    ref.strides[i] = static_cast<int64_t>(keep.array.stride(i));
  }
  ref.data = keep.array.data();
  expect_dtype(name, ref, allowed);
  return false;
}


// ------------------------------------------------------------------------------------------- Checkpoint
nb::dict spec_dict(const nvfp4moe::MoeSpec& s) {
  nb::dict d;
  d["layer"] = s.layer;
  d["hidden"] = s.hidden;
  d["intermediate"] = s.intermediate;
  d["num_experts"] = s.num_experts;
  d["top_k"] = s.top_k;
  d["activation"] = nvfp4moe::activation_name(s.activation);
  d["routing"] = nvfp4moe::routing_name(s.routing);
  d["norm_topk_prob"] = s.norm_topk_prob;
  d["n_group"] = s.n_group;
  d["topk_group"] = s.topk_group;
  d["routed_scaling_factor"] = s.routed_scaling_factor;
  d["has_router_bias"] = s.has_router_bias;
  d["shared_intermediate"] = s.shared_intermediate;
  d["shared_expert_gated"] = s.shared_expert_gated;
  return d;
}

class PyCheckpoint {
 public:
  explicit PyCheckpoint(const std::string& path) : path_(path) {
    nb::gil_scoped_release nogil;
    ckpt_ = nvfp4moe::Checkpoint::open(path);
  }
  const nvfp4moe::Checkpoint& get() const {
    if (!ckpt_) raise_value_error("nvfp4moe.Checkpoint('" + path_ + "') is closed");
    return *ckpt_;
  }
  const std::string& path() const { return path_; }
  bool closed() const { return !ckpt_; }
  void close() { ckpt_.reset(); }
  std::vector<int> moe_layers() const { return get().moe_layers(); }
  nb::list layers() const {
    nb::list out;
    for (const auto& l : get().layers()) {
      nb::dict d;
      d["layer"] = l.layer;
      d["is_moe"] = l.is_moe;
      d["prefix"] = l.prefix;
      d["experts_found"] = l.experts_found;
      out.append(d);
    }
    return out;
  }
  nb::dict spec(nb::handle layer) const {
    return spec_dict(get().spec(static_cast<int>(int_arg(layer, "layer", 0, INT_MAX))));
  }
  std::string inspect() const { return get().inspect(); }
  std::vector<std::string> exclude_modules() const { return get().exclude_modules(); }
  std::string format() const {
    switch (get().format()) {
      case nvfp4moe::CheckpointFormat::ModelOpt: return "modelopt";
      case nvfp4moe::CheckpointFormat::CompressedTensors: return "compressed-tensors";
      case nvfp4moe::CheckpointFormat::Bf16: return "bf16";
    }
    return "unknown";
  }

 private:
  std::string path_;
  std::shared_ptr<nvfp4moe::Checkpoint> ckpt_;
};

// ------------------------------------------------------------------------------------------- MoeLayer
nb::object g_out_allocator;  // Python fallback for out=None with non-torch inputs (set by __init__.py)

void parse_device(const std::string& device, nvfp4moe::MoeLayerOptions& o) {
  if (device == "cpu") {
    o.backend = nvfp4moe::Backend::Cpu;
    o.device = 0;
    return;
  }
  if (device.rfind("cuda", 0) == 0) {
    o.backend = nvfp4moe::Backend::Cuda;
    o.device = 0;
    if (device.size() > 4) {
      // N: decimal digits only (std::stoi alone took "cuda: 0" and "cuda:+0"); at most 9, so it fits an int.
      const std::string n = device[4] == ':' ? device.substr(5) : std::string();
      if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos)
        raise_value_error("device: expected \"cpu\", \"cuda\" or \"cuda:N\", got \"" + device + "\"");
      o.device = std::stoi(n);
    }
    return;
  }
  raise_value_error("device: expected \"cpu\", \"cuda\" or \"cuda:N\", got \"" + device + "\"");
}

class PyMoeLayer {
 public:
  // layer and max_tokens as Python objects: see int_arg.
  PyMoeLayer(const PyCheckpoint& ckpt, nb::handle layer_arg, const std::string& mode, nb::handle max_tokens,
             const std::string& device, bool shared_max_input_scale) {
    nvfp4moe::MoeLayerOptions o;
    if (!nvfp4moe::mode_from_name(mode, &o.mode))
      raise_value_error("mode: expected \"w4a16\" or \"w4a4\", got \"" + mode + "\"");
    const int layer = static_cast<int>(int_arg(layer_arg, "layer", 0, INT_MAX));
    o.max_tokens = int_arg(max_tokens, "max_tokens", 1, INT64_MAX);
    parse_device(device, o);
    o.shared_max_input_scale = shared_max_input_scale;
    const nvfp4moe::Checkpoint& c = ckpt.get();
    nb::gil_scoped_release nogil;
    layer_ = nvfp4moe::MoeLayer::create(c, layer, o);
    cpu_ = o.backend == nvfp4moe::Backend::Cpu;
  }

  nb::object forward(nb::handle hidden, nb::handle router_logits, nb::handle topk_ids, nb::handle topk_weights,
                     nb::handle out, nb::handle stream, int bench_iters = 0, double* bench_seconds = nullptr) {
    Keep keep[5];
    // Per-thread scratch: the vectors keep their capacity, so a call allocates nothing on the host.
    thread_local TensorRef h, l, ids, w, o;
    const bool torch_in = to_ref(hidden, "hidden", h, keep[0], {DType::BF16, DType::F32});
    nvfp4moe::RoutingArgs r;
    if (!router_logits.is_none()) {
      to_ref(router_logits, "router_logits", l, keep[1], {DType::F32});
      r.router_logits = &l;
    }
    if (!topk_ids.is_none()) {
      to_ref(topk_ids, "topk_ids", ids, keep[2], {DType::I32});
      r.topk_ids = &ids;
    }
    if (!topk_weights.is_none()) {
      to_ref(topk_weights, "topk_weights", w, keep[3], {DType::F32});
      r.topk_weights = &w;
    }
    nb::object out_obj;
    if (out.is_none()) {
      const int64_t T = h.shape.empty() ? 0 : h.shape[0];
      nb::tuple shape = nb::make_tuple(T, layer_->spec().hidden);
      if (torch_in)
        out_obj = hidden.attr("new_empty")(shape);
      else if (g_out_allocator.is_valid() && !g_out_allocator.is_none())
        out_obj = g_out_allocator(hidden, shape);
      else
        raise_type_error("out: pass an output array for inputs of type " + pytype_name(hidden));
    } else {
      out_obj = nb::borrow(out);
    }
    to_ref(out_obj, "out", o, keep[4], {DType::BF16, DType::F32}, /*writable=*/true);

    void* s = nullptr;
    if (!stream.is_none()) {
      s = stream_arg(stream);
    } else if (torch_in && h.device == DeviceType::CUDA && !g_torch.raw_stream.is_none()) {
      s = reinterpret_cast<void*>(nb::cast<uintptr_t>(g_torch.raw_stream(h.device_id)));
    }
    if (bench_iters <= 0) {
      nb::gil_scoped_release nogil;
      // The CPU backend's workspace is per layer: serialize Python threads sharing one layer (taken after the
      // GIL is released, so a waiting thread never blocks the interpreter). A CUDA layer orders its calls by
      // stream; one layer per concurrent stream.
      std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
      if (cpu_) lock.lock();
      layer_->forward(h, r, o, s);
    } else {  // timing of the C++ call alone (the Python overhead test compares against it)
      nb::gil_scoped_release nogil;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < bench_iters; ++i) layer_->forward(h, r, o, s);
      *bench_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return out_obj;
  }

  double bench(nb::handle hidden, nb::handle router_logits, nb::handle topk_ids, nb::handle topk_weights,
               nb::handle out, nb::handle stream, int iters) {
    double seconds = 0;
    forward(hidden, router_logits, topk_ids, topk_weights, out, stream, iters < 1 ? 1 : iters, &seconds);
    return seconds;
  }

  nvfp4moe::MoeLayer& get() { return *layer_; }
  nb::dict spec() const { return spec_dict(layer_->spec()); }
  std::string mode() const { return nvfp4moe::mode_name(layer_->options().mode); }
  std::string device() const {
    const auto& o = layer_->options();
    return o.backend == nvfp4moe::Backend::Cpu ? std::string("cpu") : "cuda:" + std::to_string(o.device);
  }
  int64_t max_tokens() const { return layer_->options().max_tokens; }
  int64_t hidden_size() const { return layer_->spec().hidden; }

 private:
  std::unique_ptr<nvfp4moe::MoeLayer> layer_;
  bool cpu_ = true;
  std::mutex mutex_;
};

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "nvfp4moe C++ core (nanobind); use the nvfp4moe package, not this module directly";

  g_format_error = PyErr_NewExceptionWithDoc(
      "nvfp4moe.FormatError", "A malformed or unsupported checkpoint file (nvfp4moe::FormatError).",
      PyExc_ValueError, nullptr);
  m.attr("FormatError") = nb::handle(g_format_error);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void*) {
        try {
          std::rethrow_exception(p);
        } catch (const nvfp4moe::FormatError& e) {
          PyErr_SetString(g_format_error, e.what());
        } catch (const nvfp4moe::ArgumentError& e) {
          PyErr_SetString(PyExc_ValueError, e.what());
        } catch (const nvfp4moe::Error& e) {
          PyErr_SetString(PyExc_RuntimeError, e.what());
        }
      });

#ifdef NVFP4MOE_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  m.def("cuda_available", &nvfp4moe::cuda_backend_available,
        "True when the extension was built with the CUDA backend and a CUDA device is present.");
  m.def("_set_out_allocator", [](nb::object fn) { g_out_allocator = std::move(fn); });
  // Drop the Python references this module holds before the interpreter tears down.
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([]() {
    g_out_allocator = nb::object();
    g_torch.raw_stream = nb::object();
  }));

  nb::class_<PyCheckpoint>(m, "Checkpoint")
      .def(nb::init<const std::string&>(), "path"_a)
      .def_prop_ro("path", &PyCheckpoint::path)
      .def_prop_ro("closed", &PyCheckpoint::closed)
      .def_prop_ro("moe_layers", &PyCheckpoint::moe_layers)
      .def_prop_ro("layers", &PyCheckpoint::layers)
      .def_prop_ro("format", &PyCheckpoint::format)
      .def_prop_ro("exclude_modules", &PyCheckpoint::exclude_modules)
      .def("spec", &PyCheckpoint::spec, "layer"_a)
      .def("inspect", &PyCheckpoint::inspect)
      .def("close", &PyCheckpoint::close);

  nb::class_<PyMoeLayer>(m, "MoeLayer")
      .def(nb::init<const PyCheckpoint&, nb::handle, const std::string&, nb::handle, const std::string&, bool>(),
           "checkpoint"_a, "layer"_a, "mode"_a, "max_tokens"_a, "device"_a, "shared_max_input_scale"_a)
      .def("forward",
           [](PyMoeLayer& l, nb::handle hidden, nb::handle logits, nb::handle ids, nb::handle w, nb::handle out,
              nb::handle stream) { return l.forward(hidden, logits, ids, w, out, stream); },
           "hidden"_a, "router_logits"_a.none() = nb::none(),
           "topk_ids"_a.none() = nb::none(), "topk_weights"_a.none() = nb::none(), "out"_a.none() = nb::none(),
           "stream"_a.none() = nb::none())
      .def("_bench_forward", &PyMoeLayer::bench, "hidden"_a, "router_logits"_a.none(), "topk_ids"_a.none(),
           "topk_weights"_a.none(), "out"_a.none(), "stream"_a.none(), "iters"_a,
           "Runs the C++ forward `iters` times after one argument conversion; returns the seconds it took.")
      .def_prop_ro("spec", &PyMoeLayer::spec)
      .def_prop_ro("mode", &PyMoeLayer::mode)
      .def_prop_ro("device", &PyMoeLayer::device)
      .def_prop_ro("max_tokens", &PyMoeLayer::max_tokens)
      .def_prop_ro("hidden_size", &PyMoeLayer::hidden_size)
      .def_prop_ro("weight_bytes", [](PyMoeLayer& l) { return l.get().weight_bytes(); })
      .def_prop_ro("workspace_bytes", [](PyMoeLayer& l) { return l.get().workspace_bytes(); })
      .def("begin_calibration", [](PyMoeLayer& l) { l.get().begin_calibration(); })
      .def("end_calibration", [](PyMoeLayer& l) { l.get().end_calibration(); });

#ifdef NVFP4MOE_PY_HAVE_SYNTHETIC
  m.attr("have_generator") = true;
  m.def("synthetic_presets", &nvfp4moe::model::synthetic_presets);
  m.def(
      "generate_checkpoint",
      [](const std::string& dir, const std::string& preset, std::optional<std::string> style,
         std::optional<int64_t> hidden, std::optional<int64_t> intermediate, std::optional<int64_t> experts,
         std::optional<int64_t> top_k, std::optional<std::string> routing, std::optional<std::string> activation,
         std::optional<bool> norm_topk_prob, std::optional<int64_t> shared_intermediate,
         std::optional<int64_t> n_group, std::optional<int64_t> topk_group,
         std::optional<float> routed_scaling_factor, std::optional<bool> router_bias, int layers,
         int first_dense_layers, uint64_t seed, std::optional<size_t> max_shard_bytes, bool overwrite) {
        namespace md = nvfp4moe::model;
        md::SyntheticOptions o;
        o.preset = preset;
        if (style) {
          md::ModelStyle st;
          if (!md::style_from_name(*style, &st)) raise_value_error("style: unknown model style \"" + *style + "\"");
          o.style = st;
        }
        o.hidden = hidden;
        o.intermediate = intermediate;
        o.experts = experts;
        o.top_k = top_k;
        if (routing) {
          if (*routing == "softmax_topk") o.routing = nvfp4moe::Routing::SoftmaxTopK;
          else if (*routing == "sigmoid_grouped_topk") o.routing = nvfp4moe::Routing::SigmoidGroupedTopK;
          else raise_value_error("routing: expected \"softmax_topk\" or \"sigmoid_grouped_topk\", got \"" + *routing + "\"");
        }
        if (activation) {
          if (*activation == "swiglu") o.activation = nvfp4moe::Activation::SwiGLU;
          else if (*activation == "relu2") o.activation = nvfp4moe::Activation::Relu2;
          else raise_value_error("activation: expected \"swiglu\" or \"relu2\", got \"" + *activation + "\"");
        }
        o.norm_topk_prob = norm_topk_prob;
        o.shared_intermediate = shared_intermediate;
        o.n_group = n_group;
        o.topk_group = topk_group;
        o.routed_scaling_factor = routed_scaling_factor;
        o.router_bias = router_bias;
        o.layers = layers;
        o.first_dense_layers = first_dense_layers;
        o.seed = seed;
        if (max_shard_bytes) o.max_shard_bytes = *max_shard_bytes;
        o.overwrite = overwrite;
        nb::gil_scoped_release nogil;
        return md::generate_synthetic_checkpoint(dir, o).dir;
      },
      "dir"_a, nb::kw_only(), "preset"_a = "", "style"_a = nb::none(), "hidden"_a = nb::none(),
      "intermediate"_a = nb::none(), "experts"_a = nb::none(), "top_k"_a = nb::none(), "routing"_a = nb::none(),
      "activation"_a = nb::none(), "norm_topk_prob"_a = nb::none(), "shared_intermediate"_a = nb::none(),
      "n_group"_a = nb::none(), "topk_group"_a = nb::none(), "routed_scaling_factor"_a = nb::none(),
      "router_bias"_a = nb::none(), "layers"_a = 1, "first_dense_layers"_a = 0, "seed"_a = 1,
      "max_shard_bytes"_a = nb::none(), "overwrite"_a = false,
      "Writes a synthetic NVFP4 checkpoint (src/model/synthetic.h) into dir; returns dir.");
#else
  m.attr("have_generator") = false;
#endif
}
