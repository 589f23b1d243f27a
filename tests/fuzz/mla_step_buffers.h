// The caller buffers of plan_mla_step for the fuzz targets (fuzz_mla_step, fuzz_mla_dcp_step):
// every one filled with a canary and snapshotted, so a rejection that writes anything is seen.
#pragma once

#include <cstdint>
#include <vector>

#include "ascend_attn_rt/mla/plan/mla_plan.h"
#include "fuzz_util.h"

namespace aar::fuzz {

struct MlaStepCanaries {
  // rows: room for requests / tokens; stride: block-table columns; T: input tokens; mc: chunk
  // rows; ctx: reorg_index entries (DCP); scratch: the DCP scratch's entries (0 without DCP).
  MlaStepCanaries(size_t rows, int32_t stride, int32_t T, size_t mc, size_t ctx = 0, size_t scratch = 0)
      : stride_(stride) {
    const size_t st = static_cast<size_t>(stride);
    qsl = canary<int32_t>(rows + 1, -9), table = canary<int32_t>(rows * st, -9);
    q_ends = canary<int64_t>(rows, -9), kv = canary<int64_t>(rows, -9);
    slots = canary<int64_t>(room(T), -9);
    dpos = canary<int32_t>(rows, -9), ppos = canary<int32_t>(rows, -9);
    ptable = canary<int32_t>(rows * st, -9);
    pq = canary<int64_t>(rows, -9);
    cu = canary<int32_t>(mc * (rows + 1), -9), starts = canary<int32_t>(mc * rows, -9);
    clens = canary<int32_t>(mc * rows, -9);
    kv_ends = canary<int64_t>(mc * rows, -9), tot = canary<int64_t>(mc, -9), maxl = canary<int64_t>(mc, -9);
    const bool dcp = ctx > 0 || scratch > 0;
    plen = canary<int32_t>(dcp ? mc * rows : 0, -9);
    ltot = canary<int64_t>(dcp ? mc : 0, -9), roff = canary<int64_t>(dcp ? mc + 1 : 0, -9);
    ridx = canary<int64_t>(ctx, -9);
    blens = canary<int32_t>(scratch, -9);
    pre = canary<uint8_t>(scratch, 0xAB);
    dtable = canary<int32_t>(dcp ? rows * st : 0, -9);
    dq = canary<int64_t>(dcp ? rows : 0, -9), dkv = canary<int64_t>(dcp ? rows : 0, -9);
    snap.add(qsl), snap.add(table), snap.add(q_ends), snap.add(kv), snap.add(slots), snap.add(dpos);
    snap.add(ppos), snap.add(ptable), snap.add(pq), snap.add(cu), snap.add(starts), snap.add(clens);
    snap.add(kv_ends), snap.add(tot), snap.add(maxl), snap.add(plen), snap.add(ltot), snap.add(roff);
    snap.add(ridx), snap.add(blens), snap.add(pre), snap.add(dtable), snap.add(dq), snap.add(dkv);
  }
  MlaStepCanaries(const MlaStepCanaries&) = delete;  // the snapshot points into the vectors

  plan::MlaStepBuffers spans() {
    plan::MlaStepBuffers b{qsl, table, stride_, q_ends, kv, slots, dpos, ppos, ptable, pq,
                           {cu, starts, clens, kv_ends, tot, maxl, plen, ltot, ridx, roff}};
    b.dcp_block_lens = blens;
    b.dcp_is_prefilling = pre;
    b.dcp_decode_block_table = dtable;
    b.dcp_decode_q_ends = dq;
    b.dcp_decode_kv_lens = dkv;
    return b;
  }

  std::vector<int32_t> qsl, table, dpos, ppos, ptable, cu, starts, clens, plen, blens, dtable;
  std::vector<int64_t> q_ends, kv, slots, pq, kv_ends, tot, maxl, ltot, roff, ridx, dq, dkv;
  std::vector<uint8_t> pre;
  Snapshot snap;

 private:
  int32_t stride_;
};

}  // namespace aar::fuzz
