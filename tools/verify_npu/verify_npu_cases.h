// The rows of verify-npu (include/ascend_attn_rt/verify_npu.h), private to
// tools/verify_npu/verify_npu*.cpp: one Case per operator call with an argument
// combination a backend uses. A Case builds its inputs on the CPU from a fixed
// seed, moves them to the side's device (`Side::to`), calls the operator
// through the side's provider and returns its outputs on the CPU; the harness
// runs it once per side on fresh copies and compares output by output.
//
// Shared conventions of the rows (decisions where the spec is silent):
//  - Host arguments stay on the host on both sides (FIA's length lists,
//    _npu_paged_attention's context_lens): `Side::host` keeps them.
//  - Opaque tiling blobs (the *_metadata operators) are not compared byte for
//    byte (the device's tiling data is not the twin's): a metadata row runs the
//    attention operator with the blob made on the same side and compares the
//    attention output, so it checks that the device's blob drives the device's
//    kernel to the twin's answer.
//  - Quantised outputs are compared dequantised (value * scale) with a
//    tolerance of about one quantum (int8: 1/127 of the row's amax, fp8 e4m3:
//    1/16), since a one-step rounding difference of the device is not an error
//    of the twin's reading; where the scale is a power of two (MX, the DSA
//    640-byte rows) the bytes are compared exactly: the rounding is then exact.
//  - Index outputs (top-k positions) are compared exactly, each row's entries
//    sorted (the selected set; the order among equal scores is the kernel's),
//    over float inputs drawn so ties are improbable.
//  - Shapes: the head / latent / rope dims the models use where the operator's
//    format fixes them (SFA 512 + 64, the 656- and 640-byte rows, DSA D 512,
//    Di 128), small elsewhere; small token and head counts throughout.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/provider.h"

namespace aar::verify::detail {

// One side of a row: inputs made on the CPU are moved to `dev`, the operator
// runs through provider `pv`, outputs come back to the CPU.
struct Side {
  c10::Device dev;
  ops::Provider pv;
  at::Tensor to(const at::Tensor& t) const { return t.to(dev); }
};

using Outputs = std::vector<at::Tensor>;

struct Case {
  const char* op;          // operator schema name
  std::string args;        // the argument combination
  const char* assumption;  // the open assumption the row settles
  double tol;              // per output: max |npu - twin| <= tol * (1 + max |twin|)
  std::function<Outputs(const Side&)> run;
};

constexpr int64_t kMax = 2147483647;

// Deterministic inputs.
at::Tensor i32(const std::vector<int64_t>& v);
at::Tensor rnd(at::IntArrayRef shape, at::ScalarType dt, double scale = 1.0);
// Cumulative ends of `lens`.
std::vector<int64_t> cumsum(const std::vector<int64_t>& lens);

// A paged cache (nb, bs, rest...) filled with `fill` (random by default) and a
// shuffled (B, max_blocks) int32 block table covering `lens` tokens per
// request; block 0 is never referenced (a stale page).
struct Paged {
  at::Tensor cache, table;
  int64_t nb = 0;
};
Paged paged(const std::vector<int64_t>& lens, int64_t bs, std::vector<int64_t> rest, at::ScalarType dt,
            uint64_t seed);
// The same block table over another cache shape (a second cache of the same pages).
at::Tensor like_pages(const Paged& p, std::vector<int64_t> rest, at::ScalarType dt, uint64_t seed);

// Every output on the CPU (undefined ones become empty tensors).
Outputs on_cpu(std::initializer_list<at::Tensor> ts);
// Each row's last-dim entries sorted: index outputs as sets.
at::Tensor sorted_rows(const at::Tensor& idx);

// FIA v1 / v2 through the plain overload (returns (out, lse) with the LSE
// flag, else (out)), or, with `out_shape`, through the .out overload as the
// GQA / C8 / FA3 / MLA-decode backends call it: into a (out_shape, out_dtype)
// buffer, the LSE into their (1,) fp32 placeholder (returns (out)).
Outputs run_fia(const ops::FiaTensors& t, const ops::FiaParams& p, const Side& s,
                const std::vector<int64_t>& out_shape = {}, at::ScalarType out_dtype = at::kHalf);
Outputs run_fia_v2(const ops::FiaV2Tensors& t, const ops::FiaV2Params& p, const Side& s,
                   const std::vector<int64_t>& out_shape = {}, at::ScalarType out_dtype = at::kHalf);
// " through .out (...)" for a row's arguments.
const char* out_note(bool out);

// The row groups (one file each).
void add_mla_cases(std::vector<Case>& c);     // verify_npu_mla.cpp
void add_sparse_cases(std::vector<Case>& c);  // verify_npu_sparse.cpp (SFA)
void add_dsa_cases(std::vector<Case>& c);     // verify_npu_dsa.cpp
void add_quant_cases(std::vector<Case>& c);   // verify_npu_quant.cpp (quant, MX, Hadamard, GQA extras)

}  // namespace aar::verify::detail
