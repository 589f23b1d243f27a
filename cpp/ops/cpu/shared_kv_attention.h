// Internal: the shared-KV sparse attention of docs/design/dsa.md §1.4 as the
// npu_sparse_attn_sharedkv CPU twin computes it (sparse_attn_sharedkv_cpu.cpp),
// for the other twins with the same semantics (SparseFlashMla,
// sparse_flash_mla_cpu.cpp). `op` names the calling operator in every error;
// layout_kv must be "PA_ND" (the paged caches), seqused_kv the raw lengths.
#pragma once

#include "../op_signatures.h"

namespace aar::ops::cpu {

sig::SasResult shared_kv_attention(const char* op, AAR_SPARSE_ATTN_SHAREDKV_PARAMS);

}  // namespace aar::ops::cpu
