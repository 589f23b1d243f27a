"""Every provider dispatches like torch_npu's operators: no Autograd kernel of our own (torch_npu registers
none for these inference operators), and every call through the runtime's operator wrappers runs under
c10::InferenceMode, entered by the wrapper when the caller is not already in it. So the no-compute
provider's host-time figures pay the same guard and dispatch as the NPU path."""

import warnings

import pytest
import torch

import ascend_attn_rt as aar
from ascend_attn_rt import _C

NAMESPACES = {"cpu": "ascend_cpu", "no_compute": "ascend_noop"}
OPS = [name for name, _, _ in aar.op_schemas()]
VA_OPS = [name for name, _ in aar.vllm_ascend_op_schemas()]


@pytest.mark.parametrize("ns,name", [(ns, n) for ns in NAMESPACES.values() for n in OPS]
                         + [(ns, n) for ns in ("ascend_cpu_va", "ascend_noop_va") for n in VA_OPS])
def test_no_autograd_kernel(ns, name):
    qualified = f"{ns}::{name}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CPU"), qualified  # the operator is there
    for key in ("Autograd", "AutogradCPU", "AutogradPrivateUse1", "CompositeImplicitAutograd"):
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key), f"{qualified}: {key} kernel"


def _merge_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(6, generator=g) for _ in range(2)], [torch.randn(6, 8, generator=g) for _ in range(2)]


@pytest.fixture
def spy():
    """Replaces a provider's CPU kernel of npu_attention_update with one that records whether InferenceMode
    was enabled when the dispatcher reached it; the original kernel is restored afterwards."""
    libs, seen = [], []

    def install(ns):
        lib = torch.library.Library(ns, "IMPL")
        libs.append(lib)

        def kernel(lse, local_out, update_type):
            seen.append(torch.is_inference_mode_enabled())
            return torch.zeros_like(local_out[0]), torch.zeros_like(lse[0])

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            lib.impl("npu_attention_update", kernel, "CPU")
        return seen

    yield install
    for lib in libs:
        lib._destroy()


@pytest.mark.parametrize("provider", list(NAMESPACES))
def test_wrapper_calls_run_under_inference_mode(spy, provider):
    seen = spy(NAMESPACES[provider])
    lses, outs = _merge_inputs()
    assert not torch.is_inference_mode_enabled()
    _C._testing.attention_update(lses, outs, 1, provider)           # the wrapper enters the guard
    with torch.inference_mode():
        _C._testing.attention_update(lses, outs, 1, provider)       # already in it: kept
    with torch.inference_mode(False):
        _C._testing.attention_update(lses, outs, 1, provider)
    assert seen == [True, True, True]
    assert not torch.is_inference_mode_enabled()                     # and left on return


def test_cpu_twin_results_are_inference_tensors_and_inputs_may_require_grad():
    # What the guard means for a caller outside inference mode: results are inference tensors (as on the
    # NPU path), inputs that require grad are fine, and nothing goes through autograd.
    lses, outs = _merge_inputs()
    outs = [o.requires_grad_() for o in outs]
    out, lse = _C._testing.attention_update(lses, outs, 1, "cpu")
    assert out.is_inference() and lse.is_inference()
    assert out.grad_fn is None and not out.requires_grad
