// Zero-copy nanobind caster between at::Tensor and torch.Tensor.
//
// torch's own header (torch/csrc/autograd/python_variable.h) drags in pybind11;
// the three symbols the caster needs are declared here instead, exactly as
// torch 2.13 exports them from libtorch_python (the layout of THPVariable's
// head, a PyObject header followed by the at::Tensor, has been stable for years;
// tests/python/test_tensor_caster.py checks the round trip keeps data pointers
// and object identity).
#pragma once

#include <ATen/core/Tensor.h>
#include <nanobind/nanobind.h>

#include <string>

extern PyObject* THPVariableClass;
extern PyObject* ParameterClass;
PyObject* THPVariable_Wrap(const at::TensorBase& var);

namespace aar::bindings {
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
// Borrowed view of a torch.Tensor argument without any refcount traffic (hot
// paths: the Python object outlives the call). None gives an undefined tensor
// when `none_ok`; anything else is a ValueError naming the argument.
inline const at::Tensor& borrow_tensor(nanobind::handle h, const char* name, bool none_ok) {
  static const at::Tensor undefined;
  if (none_ok && h.is_none()) return undefined;
  if (!is_torch_tensor(h.ptr())) {
    throw nanobind::value_error((std::string(name) + " must be a torch.Tensor" + (none_ok ? " or None" : "")).c_str());
  }
  return reinterpret_cast<THPVariableHead*>(h.ptr())->cdata;
}

}  // namespace aar::bindings

namespace nanobind::detail {

template <>
struct type_caster<at::Tensor> {
  NB_TYPE_CASTER(at::Tensor, const_name("torch.Tensor"))

  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    if (!aar::bindings::is_torch_tensor(src.ptr())) return false;
    value = reinterpret_cast<aar::bindings::THPVariableHead*>(src.ptr())->cdata;
    return true;
  }

  static handle from_cpp(const at::Tensor& t, rv_policy, cleanup_list*) noexcept {
    if (!t.defined()) return none().release();
    return THPVariable_Wrap(t);
  }
};

}  // namespace nanobind::detail
