// Compile-time check of tensor_caster.h against the torch being built with:
// torch's own THPVariable (torch/csrc/autograd/python_variable.h, whose
// THPVariable_Unpack returns its `cdata`) must hold an at::Tensor right where
// the caster reads it, and the caster's declarations of libtorch_python's
// symbols must be torch's (a mismatch is a conflicting redeclaration here).
// This is the only binding file that includes torch's Python headers (they
// bring pybind11); it generates no code.
#include <torch/csrc/autograd/python_variable.h>

#include <cstddef>
#include <type_traits>

#include "tensor_caster.h"

static_assert(std::is_same_v<decltype(THPVariable::cdata), at::Tensor>,
              "torch's THPVariable no longer holds an at::Tensor: update tensor_caster.h");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
static_assert(offsetof(THPVariable, cdata) == offsetof(aar::bindings::THPVariableHead, cdata),
              "torch's THPVariable keeps its at::Tensor at another offset: update tensor_caster.h");
#pragma GCC diagnostic pop
static_assert(std::is_same_v<decltype(THPVariable_Unpack(static_cast<PyObject*>(nullptr))), const at::Tensor&>,
              "torch's THPVariable_Unpack no longer returns const at::Tensor&: update tensor_caster.h");
