// Sylvester Hadamard matrices (docs/design/sparse.md §3), torch-free: the rotation
// the quantised indexers apply before quantising (SFA LI C8: x @ H128 /
// sqrt(128) for q and k; DSV4's rotate_activation: zero-pad to the next power
// of two, x_pad @ H^T, times d^-0.5 with the ORIGINAL d, crop). The tensor
// form lives in ascend_attn_rt/ops/hadamard.h.
//
// Sylvester's construction H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]] gives
// H_n[i][j] = (-1)^popcount(i & j): symmetric, H H^T = n I, so H / sqrt(n) is
// orthogonal (dot products, hence unquantised scores, are unchanged).
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

constexpr bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// The Sylvester size DSV4 pads a d-wide activation to: 2^ceil(log2 d), d >= 1.
int64_t hadamard_size(int64_t d);

// H_n[i][j] of the Sylvester matrix: +1 or -1.
constexpr int hadamard_sign(uint64_t i, uint64_t j) { return __builtin_popcountll(i & j) % 2 == 0 ? 1 : -1; }

// Writes scale * H_n row-major into out (n * n floats). n must be a power of
// two and out at least n * n long: InvalidArgument (naming the argument and its
// value) otherwise, before any write.
void fill_hadamard(int64_t n, double scale, Span<float> out);

}  // namespace aar::plan
