"""The zero-copy at::Tensor caster (cpp/bindings/tensor_caster.h), through the _C._testing hooks: C++ gets
torch's own at::Tensor (same TensorImpl, same data, same view geometry), a tensor handed back is the caller's
Python object, and bad arguments are refused by name."""

import sys

import pytest
import torch

from ascend_attn_rt import _C

T = _C._testing


class MyTensor(torch.Tensor):
    pass


def _cases():
    base = torch.arange(48, dtype=torch.float32).view(6, 8)
    return {
        "contiguous": torch.randn(3, 4),
        "parameter": torch.nn.Parameter(torch.randn(5)),
        "frozen_parameter": torch.nn.Parameter(torch.randn(5), requires_grad=False),
        "subclass": torch.randn(2, 3).as_subclass(MyTensor),
        "transposed_view": base.t(),
        "strided_offset_view": base[1:, ::3],
        "expanded": torch.randn(1, 4).expand(3, 4),
        "bf16_requires_grad": torch.randn(4, dtype=torch.bfloat16, requires_grad=True),
        "empty": torch.empty(0, 7),
        "scalar": torch.tensor(3.5),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_cpp_sees_the_callers_tensor_and_returns_the_same_object(name):
    x = _cases()[name]
    impl, data, sizes, strides, offset = T.describe(x)
    assert impl == x._cdata  # the same TensorImpl: nothing copied, nothing re-wrapped
    assert data == x.data_ptr()
    assert (sizes, strides, offset) == (list(x.shape), list(x.stride()), x.storage_offset())
    y = T.identity(x)
    assert y is x and type(y) is type(x)
    assert T.borrow(x) is x
    assert T.identity_optional(x) is x


def test_views_stay_views():
    base = torch.zeros(4, 6)
    v = base[:, 1::2]
    assert not v.is_contiguous()
    y = T.identity(v)
    assert y is v and not y.is_contiguous()
    y.fill_(1.0)  # writes land in the base: still an alias
    assert base[:, 1::2].eq(1).all() and base[:, 0::2].eq(0).all()


def test_inference_tensors_pass():
    with torch.inference_mode():
        x = torch.randn(3)
    assert x.is_inference() and T.identity(x) is x and T.describe(x)[0] == x._cdata


def test_no_reference_leak():
    x = torch.randn(8)
    before = sys.getrefcount(x)
    for _ in range(100):
        y = T.identity(x)
        T.borrow(x)
        T.describe(x)
    del y
    assert sys.getrefcount(x) == before


def test_none():
    assert T.identity_optional(None) is None
    assert T.borrow(None, none_ok=True) is None
    with pytest.raises(TypeError, match=r"x: torch\.Tensor"):
        T.identity(None)
    with pytest.raises(ValueError, match="x must be a torch.Tensor, got NoneType"):
        T.borrow(None)


@pytest.mark.parametrize("bad", [[1.0, 2.0], 3.0, "tensor", object()])
def test_non_tensor_is_refused_naming_the_argument(bad):
    with pytest.raises(TypeError, match=r"identity\(x: torch\.Tensor\)"):
        T.identity(bad)
    with pytest.raises(TypeError, match=r"x: torch\.Tensor \| None"):
        T.identity_optional(bad)
    with pytest.raises(ValueError, match=rf"x must be a torch.Tensor or None, got {type(bad).__name__}"):
        T.borrow(bad, none_ok=True)


def test_numpy_array_is_not_a_tensor():
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match=r"x must be a torch.Tensor, got (numpy\.)?ndarray"):
        T.borrow(np.zeros(3))
