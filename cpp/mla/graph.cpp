#include "ascend_attn_rt/mla/graph.h"

namespace aar::mla {

graph::StepParams graph_step_params(const Metadata& md) {
  graph::StepParams sp;
  sp.block_tables = md.decode.block_table;
  sp.q_ends = md.decode.actual_seq_lengths_q;
  sp.kv_lens = md.decode.seq_lens_list;
  sp.num_reqs = md.decode.num_kernel_reqs;  // dummies included (graph decode padding)
  sp.num_real_reqs = md.num_decodes;
  sp.num_kernel_tokens = md.speculative ? md.decode.num_kernel_tokens : md.decode.num_kernel_reqs;
  sp.stamp = md.stamp;
  return sp;
}

}  // namespace aar::mla
