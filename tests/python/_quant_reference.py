"""W8A8 weights for the MLA-family tests, built from float weights and written from the definitions of
ascend_attn_rt/latent/quant.h, not from the runtime:

  per output row: weight_scale = amax(|W_row|) / 127, weight = rint(W_row / weight_scale)  (int8)
  dequantised weight = weight * weight_scale  (what the float64 references run with)
  W8A8 static adds a per-tensor activation scale / int8 zero point and the int32 quant_bias that carries the
  zero-point correction -input_offset * sum_k weight[o, k] (ModelSlim's convention), so that
  (x_q @ weight^T + quant_bias) * input_scale * weight_scale ~ x @ dequantised^T.

fused_qkv_a_proj stacks q_a_proj over kv_a_proj_with_mqa (rows q | kv).

MXFP8 (A5; latent/quant.h): per output row and block of 32 inputs, the OCP MX rule of _mx_reference (shared
exponent e = floor(log2(amax)) - 8, elements on the e4m3 grid, saturated to +-448); weight = those elements as
float8_e4m3fn, weight_scale = the bytes e + 127 (out, in / 32) uint8; dequantised weight = element * 2^e (exact
in bfloat16 / float16: 3 mantissa bits). The activations are quantised the same way per 32 values of a row
(mx_activations: the float64 value a layer's quantised projection multiplies).
"""

from __future__ import annotations

import torch

import ascend_attn_rt as aar
import _mx_reference as mx

F64 = torch.float64


def quantize_rows(w: torch.Tensor):
    w = w.to(F64)
    scale = w.abs().amax(1) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale.to(torch.float32)


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.to(F64) * scale.to(F64)[:, None]


def _linear(w, static, dtype, in_scale, in_offset):
    q, s = quantize_rows(w)
    if not static:
        return aar.mla.QuantLinear(q, s), dequantize(q, s)
    bias = (-in_offset * q.to(torch.int64).sum(1)).to(torch.int32)
    lin = aar.mla.QuantLinear(q, s, input_scale=torch.tensor([in_scale], dtype=dtype),
                              input_offset=torch.tensor([in_offset], dtype=torch.int8), quant_bias=bias)
    return lin, dequantize(q, s)


def quantize_mla_weights(ws, quant_type: str, dtype, *, x_scale=5.0 / 127, x_offset=2, q_scale=6.0 / 127,
                         q_offset=-1):
    """(kwargs for mla.Impl / sfa.Impl without q_a_proj / q_proj / kv_a_proj_with_mqa but with quant=...,
    the float weights dict with those three replaced by their dequantised versions, for the references).
    The static activation scales cover the test activations: hidden states ~N(0, 1), c_q after its RMSNorm."""
    static = quant_type == "w8a8_static"
    fused = torch.cat([ws["q_a_proj"], ws["kv_a_proj_with_mqa"]]).to(F64)
    f_lin, f_deq = _linear(fused, static, dtype, x_scale, x_offset)
    q_lin, q_deq = _linear(ws["q_proj"].to(F64), static, dtype, q_scale, q_offset)
    Q = ws["q_a_proj"].shape[0]
    deq = dict(ws)
    deq["q_a_proj"] = f_deq[:Q].to(dtype)
    deq["kv_a_proj_with_mqa"] = f_deq[Q:].to(dtype)
    deq["q_proj"] = q_deq.to(dtype)
    kw = {k: v for k, v in ws.items() if k not in ("q_a_proj", "q_proj", "kv_a_proj_with_mqa")}
    kw["quant"] = aar.mla.QuantWeights(quant_type, f_lin, q_lin)
    return kw, deq


def to_nz(nd: torch.Tensor) -> torch.Tensor:
    """(nb, bs, 1, D) -> FRACTAL_NZ (nb, 1, D/c, bs, c), c = 32 / element size."""
    nb, bs, _, D = nd.shape
    c = 32 // nd.element_size()
    return nd.view(nb, bs, D // c, c).permute(0, 2, 1, 3).unsqueeze(1).contiguous()


def from_nz(nz: torch.Tensor) -> torch.Tensor:
    nb, _, dc, bs, c = nz.shape
    return nz.squeeze(1).permute(0, 2, 1, 3).reshape(nb, bs, 1, dc * c)


def quantize_latent(c: torch.Tensor, kv_scale: float) -> torch.Tensor:
    """The FA-quant latent cache row: saturate_int8(rint(c / kv_scale))."""
    return torch.round(c.to(F64) / kv_scale).clamp(-128, 127).to(torch.int8)


def mx_linear(w: torch.Tensor):
    """(out, in) float weight -> (aar.mla.QuantLinear MXFP8, float64 dequantised weight)."""
    q, e = mx.quantize(w.to(F64))
    lin = aar.mla.QuantLinear(q.to(torch.float8_e4m3fn), (e + 127).to(torch.uint8))
    return lin, mx.decode(q, e)


def quantize_mla_weights_mx(ws, dtype):
    """As quantize_mla_weights for quant type "mxfp8" (the dequantised weights are exact in dtype)."""
    f_lin, f_deq = mx_linear(torch.cat([ws["q_a_proj"], ws["kv_a_proj_with_mqa"]]))
    q_lin, q_deq = mx_linear(ws["q_proj"])
    Q = ws["q_a_proj"].shape[0]
    deq = dict(ws)
    deq["q_a_proj"] = f_deq[:Q].to(dtype)
    deq["kv_a_proj_with_mqa"] = f_deq[Q:].to(dtype)
    deq["q_proj"] = q_deq.to(dtype)
    assert torch.equal(deq["q_proj"].to(F64), q_deq) and torch.equal(deq["q_a_proj"].to(F64), f_deq[:Q])
    kw = {k: v for k, v in ws.items() if k not in ("q_a_proj", "q_proj", "kv_a_proj_with_mqa")}
    kw["quant"] = aar.mla.QuantWeights("mxfp8", f_lin, q_lin)
    return kw, deq


def mx_activations(dtype):
    """project()'s act for an MXFP8 layer of activation dtype `dtype`: the input rounded to dtype (what the layer
    holds), then its MX-fp8 value (OCP rule, blocks of 32 along the row)."""
    return lambda v: mx.round_trip(v.to(dtype).to(F64))
