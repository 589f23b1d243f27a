// Shared helpers for the plan-layer tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/mla/plan/mla_plan.h"
#include "ascend_attn_rt/plan/slot_mapping.h"

// Expects `stmt` to throw aar::InvalidArgument whose message contains `substr`.
#define EXPECT_INVALID(stmt, substr)                                                     \
  do {                                                                                   \
    try {                                                                                \
      stmt;                                                                              \
      ADD_FAILURE() << "expected aar::InvalidArgument from: " #stmt;                     \
    } catch (const aar::InvalidArgument& e) {                                            \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos)                   \
          << "message '" << e.what() << "' does not contain '" << (substr) << "'";       \
    } catch (...) {                                                                      \
      ADD_FAILURE() << "wrong exception type from: " #stmt;                              \
    }                                                                                    \
  } while (0)

// Expects `stmt` to throw aar::NotSupported whose message contains `substr`.
#define EXPECT_NOT_SUPPORTED(stmt, substr)                                               \
  do {                                                                                   \
    try {                                                                                \
      stmt;                                                                              \
      ADD_FAILURE() << "expected aar::NotSupported from: " #stmt;                        \
    } catch (const aar::NotSupported& e) {                                               \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos)                   \
          << "message '" << e.what() << "' does not contain '" << (substr) << "'";       \
    } catch (...) {                                                                      \
      ADD_FAILURE() << "wrong exception type from: " #stmt;                              \
    }                                                                                    \
  } while (0)

namespace aar_test {

// Straightforward reference for the slot of every scheduled token.
inline std::vector<int32_t> naive_slots(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq_lens,
                                        const std::vector<int32_t>& table, int32_t stride, int32_t bs,
                                        std::size_t out_size) {
  std::vector<int32_t> out(out_size, -1);
  for (std::size_t r = 0; r + 1 < qsl.size(); ++r) {
    const int32_t q = qsl[r + 1] - qsl[r];
    for (int32_t j = 0; j < q; ++j) {
      const int32_t pos = seq_lens[r] - q + j;
      out[qsl[r] + j] = table[r * stride + pos / bs] * bs + pos % bs;
    }
  }
  return out;
}

// A slot-mapping batch that owns its lists; inputs() views them.
struct SlotBatch {
  std::vector<int32_t> qsl, seq_lens, table;
  int32_t stride = 0, bs = 16, num_blocks = 0;
  aar::plan::SlotMappingInputs inputs() const {
    aar::plan::SlotMappingInputs in;
    in.query_start_loc = qsl;
    in.seq_lens = seq_lens;
    in.block_table = table;
    in.block_table_stride = stride;
    in.block_size = bs;
    in.num_blocks = num_blocks;
    return in;
  }
};

inline std::vector<int32_t> lens_to_qsl(const std::vector<int32_t>& lens) {
  std::vector<int32_t> qsl(1, 0);
  for (int32_t l : lens) qsl.push_back(qsl.back() + l);
  return qsl;
}

// An MLA DCP step's inputs over the caller's arrays (one block-table row of
// `stride` per request; the arrays must outlive the inputs).
inline aar::plan::MlaStepInputs mla_dcp_inputs(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq,
                                               const std::vector<int32_t>& table, int32_t stride,
                                               int32_t block_size, int32_t num_blocks, aar::plan::DcpShard shard) {
  aar::plan::MlaStepInputs in;
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  in.block_table = table;
  in.block_table_stride = stride;
  in.block_size = block_size;
  in.num_blocks = num_blocks;
  in.dcp = shard;
  return in;
}

}  // namespace aar_test
