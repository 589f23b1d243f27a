// Zero-copy nanobind caster between at::Tensor and torch.Tensor.
//
// A torch.Tensor is torch's THPVariable: a PyObject header followed by the
// at::Tensor it wraps (torch/csrc/autograd/python_variable.h, where torch's own
// THPVariable_Unpack reads that member). That header drags pybind11 into every
// translation unit that includes it, so the caster declares the three symbols
// it needs from libtorch_python and reads the member through a struct of its
// own; tensor_caster_layout.cpp includes torch's header and checks at compile
// time, against the torch being built with, that our declarations and layout
// are torch's. The layout holds from torch 2.10 (before, the member was a
// c10::MaybeOwned<at::Tensor>): older torch is refused here. The round trip
// (same TensorImpl, same Python object, subclasses, views, None, errors) is
// tested in tests/python/test_tensor_caster.py through the _testing submodule.
#pragma once

#include <ATen/core/Tensor.h>
#include <nanobind/nanobind.h>
#include <torch/csrc/api/include/torch/version.h>  // TORCH_VERSION_MAJOR/MINOR, in every torch

#include <string>

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 10)
#error "ascend_attn_rt's tensor caster needs torch >= 2.10 (THPVariable holds an at::Tensor from 2.10 on)"
#endif

extern PyObject* THPVariableClass;
extern PyObject* ParameterClass;
PyObject* THPVariable_Wrap(const at::TensorBase& var);

namespace aar::bindings {
// The head of torch's THPVariable (checked in tensor_caster_layout.cpp).
struct THPVariableHead {
  PyObject_HEAD
  at::Tensor cdata;
};

inline bool is_torch_tensor(PyObject* o) {
  PyTypeObject* tp = Py_TYPE(o);
  if (THPVariableClass == nullptr) return false;
  if (tp == reinterpret_cast<PyTypeObject*>(THPVariableClass) ||
      tp == reinterpret_cast<PyTypeObject*>(ParameterClass)) {
    return true;
  }
  const int r = PyObject_IsInstance(o, THPVariableClass);
  if (r < 0) PyErr_Clear();
  return r == 1;
}

// The at::Tensor a torch.Tensor wraps (torch's THPVariable_Unpack); `o` must
// be a torch.Tensor (is_torch_tensor).
inline const at::Tensor& unpack_tensor(PyObject* o) { return reinterpret_cast<THPVariableHead*>(o)->cdata; }

// Borrowed view of a torch.Tensor argument without any refcount traffic (hot
// paths: the Python object outlives the call). None gives an undefined tensor
// when `none_ok`; anything else is a ValueError naming the argument.
inline const at::Tensor& borrow_tensor(nanobind::handle h, const char* name, bool none_ok) {
  static const at::Tensor undefined;
  if (none_ok && h.is_none()) return undefined;
  if (!is_torch_tensor(h.ptr())) {
    throw nanobind::value_error((std::string(name) + " must be a torch.Tensor" + (none_ok ? " or None" : "") +
                                 ", got " + nanobind::inst_name(h).c_str())
                                    .c_str());
  }
  return unpack_tensor(h.ptr());
}

}  // namespace aar::bindings

namespace nanobind::detail {

template <>
struct type_caster<at::Tensor> {
  NB_TYPE_CASTER(at::Tensor, const_name("torch.Tensor"))

  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    if (!aar::bindings::is_torch_tensor(src.ptr())) return false;
    value = aar::bindings::unpack_tensor(src.ptr());
    return true;
  }

  static handle from_cpp(const at::Tensor& t, rv_policy, cleanup_list*) noexcept {
    if (!t.defined()) return none().release();
    return THPVariable_Wrap(t);
  }
};

}  // namespace nanobind::detail
