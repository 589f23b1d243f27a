/* SFA (DeepSeek-V3.2 sparse attention) context parallelism through the C ABI (version 7): two
 * processes (this program forks them, c_cp_harness.h) join a gloo group over a TCP rendezvous
 * on 127.0.0.1, then run one SFA layer with a lightning indexer (no q-LoRA) over the same steps
 * twice:
 *   - DCP 2 (decode context parallel, interleave 2): each rank builds its view of the step
 *     (aar_sfa_builder_create_cp: its shard of the latent cache, the replicated indexer view);
 *     the layer (aar_sfa_impl_create_cp with dcp_comm) writes the latent rows it owns and every
 *     indexer row, selects the global top-k, attends the selected keys it holds and merges the
 *     partial results over the group; every rank returns every token's row;
 *   - PCP 2 (prefill context parallel): every rank builds the global step and runs its local rows
 *     (aar_sfa_builder_pcp_local_rows: the decodes, and the head and tail chunks of each prefill).
 * The steps: a prefill, a decode, a second request joining with a prefill, decodes of both, a
 * chunked prefill over cached context beside a decode, decodes. index_topk is at least the longest
 * sequence, so the indexer keeps every causal key and every output row of every rank equals the
 * dense latent attention computed in float64 (c_example.h's latent_reference; weights and tokens
 * are the same on both ranks, drawn from one seed). Each rank's latent cache holds exactly the
 * tokens it owns, its indexer cache every token (num_blocks * 2 blocks, the replicated view). A
 * few bad calls are rejected by name.
 *
 *   c_sfa_cp                       forks ranks 0 and 1, waits at most 120 s
 *   c_sfa_cp <rank> <port>         one rank, for running the two by hand */
#define _POSIX_C_SOURCE 200809L
#include "c_cp_harness.h"

enum { W = 2, INTERLEAVE = 2, REQS = 2 };
enum { SH = 2, SHID = 32, SL = 16, SP = 8, SR = 8, SV = 8, SBS = 16, SNB = 8, SMAXB = 4, STOK = 24, STEPS = 6 };
enum { NI = 2, DI = 16, TOPK = SMAXB * SBS };
enum { DEADLINE_S = 120, COMM_TIMEOUT_MS = 20000 };

static float w_q[SH * (SP + SR)][SHID], w_kva[SL + SR][SHID], g_kv[SL], w_kvb[SH * (SP + SV)][SL],
    w_o[SHID][SH * SV];
static float idx_wq_b[NI * DI][SHID], idx_wk[DI][SHID], idx_proj[NI][SHID], idx_norm_w[DI], idx_norm_b[DI];
static float x_hist[REQS][STOK][SHID]; /* hidden states each request has seen (global) */
static double inv_freq[SR / 2];
/* This rank's caches: the latent shard, the replicated indexer cache (W times the blocks). */
static float nope_cache[SNB][SBS][1][SL], rope_cache[SNB][SBS][1][SR], index_cache[SNB * W][SBS][1][DI];
static float cos_t[SMAXB * SBS][SR], sin_t[SMAXB * SBS][SR];

static void make_model(void) {
  fill(&w_q[0][0], sizeof(w_q) / sizeof(float));
  fill(&w_kva[0][0], sizeof(w_kva) / sizeof(float));
  fill(&w_kvb[0][0], sizeof(w_kvb) / sizeof(float));
  fill(&w_o[0][0], sizeof(w_o) / sizeof(float));
  for (int i = 0; i < SL; ++i) g_kv[i] = 1.0f + 0.1f * uniform();
  fill(&idx_wq_b[0][0], sizeof(idx_wq_b) / sizeof(float));
  fill(&idx_wk[0][0], sizeof(idx_wk) / sizeof(float));
  fill(&idx_proj[0][0], sizeof(idx_proj) / sizeof(float));
  for (int i = 0; i < DI; ++i) idx_norm_w[i] = 1.0f + 0.1f * uniform(), idx_norm_b[i] = 0.1f * uniform();
  /* Tables (max_position, R), both halves equal: column i has frequency i mod R/2. */
  for (int i = 0; i < SR / 2; ++i) inv_freq[i] = pow(10000.0, -2.0 * i / SR);
  for (int p = 0; p < SMAXB * SBS; ++p) {
    for (int i = 0; i < SR; ++i) {
      cos_t[p][i] = (float)cos(p * inv_freq[i % (SR / 2)]);
      sin_t[p][i] = (float)sin(p * inv_freq[i % (SR / 2)]);
    }
  }
}

static int row_written(const float* row, int n) {
  int nz = 0;
  for (int i = 0; i < n; ++i) nz |= row[i] != 0.0f;
  return nz;
}

/* One layer over the steps: DCP 2 (pcp 0) or PCP 2 (pcp 1), the same checks. */
static int run_steps(int rank, aar_cp_comm_t* comm, int pcp) {
  static float hidden[STOK * SHID], out[STOK * SHID], local_hidden[2 * STOK * SHID], local_out[2 * STOK * SHID];
  static int32_t token_index[2 * STOK];
  const char* mode = pcp ? "pcp" : "dcp";
  tensor_t tw[5], ti[5], tcos, tsin, tn, tr, tx, th, to;
  int ok = 1;
  rng = 12345; /* the same model and tokens in both modes */
  make_model();
  memset(x_hist, 0, sizeof(x_hist));
  memset(nope_cache, 0, sizeof(nope_cache));
  memset(rope_cache, 0, sizeof(rope_cache));
  memset(index_cache, 0, sizeof(index_cache));

  aar_sfa_builder_config_t bc;
  aar_sfa_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = STOK;
  bc.max_blocks_per_req = SMAXB;
  bc.block_size = SBS;
  bc.num_blocks = SNB;
  bc.cos_table = view2(&tcos, &cos_t[0][0], SMAXB * SBS, SR);
  bc.sin_table = view2(&tsin, &sin_t[0][0], SMAXB * SBS, SR);
  aar_sfa_builder_cp_t cp;
  aar_sfa_builder_cp_init(&cp);
  if (pcp) {
    cp.pcp_world_size = W;
    cp.pcp_rank = rank;
  } else {
    cp.dcp_world_size = W;
    cp.dcp_rank = rank;
  }
  cp.interleave = INTERLEAVE;
  aar_sfa_builder_t* builder = NULL;
  {
    aar_sfa_builder_cp_t bad = cp;
    if (pcp) {
      bad.pcp_rank = W;
      ok &= expect_rejected(aar_sfa_builder_create_cp(&bc, &bad, &builder), "cp->pcp_rank=2 is out of range",
                            "pcp_rank 2 of 2");
    } else {
      bad.dcp_rank = W;
      ok &= expect_rejected(aar_sfa_builder_create_cp(&bc, &bad, &builder), "cp->dcp_rank=2 is out of range",
                            "dcp_rank 2 of 2");
    }
    bad = cp;
    bad.interleave = 3;
    ok &= expect_rejected(aar_sfa_builder_create_cp(&bc, &bad, &builder), "cp->interleave=3", "interleave 3");
  }
  CHECK(aar_sfa_builder_create_cp(&bc, &cp, &builder));

  aar_sfa_impl_config_t ic;
  aar_sfa_impl_config_init(&ic);
  ic.num_heads = SH;
  ic.hidden_size = SHID;
  ic.kv_lora_rank = SL;
  ic.qk_nope_head_dim = SP;
  ic.qk_rope_head_dim = SR;
  ic.v_head_dim = SV;
  ic.has_indexer = 1;
  ic.index_n_heads = NI;
  ic.index_head_dim = DI;
  ic.index_topk = TOPK;
  aar_mla_weights_t w;
  aar_mla_weights_init(&w);
  w.q_proj = view2(&tw[0], &w_q[0][0], SH * (SP + SR), SHID);
  w.kv_a_proj_with_mqa = view2(&tw[1], &w_kva[0][0], SL + SR, SHID);
  w.kv_a_layernorm = view(&tw[2], g_kv, 1, SL, 0, 0, 0);
  w.kv_b_proj = view2(&tw[3], &w_kvb[0][0], SH * (SP + SV), SL);
  w.o_proj = view2(&tw[4], &w_o[0][0], SHID, SH * SV);
  aar_sfa_indexer_weights_t iw;
  aar_sfa_indexer_weights_init(&iw);
  iw.wq_b = view2(&ti[0], &idx_wq_b[0][0], NI * DI, SHID);
  iw.wk = view2(&ti[1], &idx_wk[0][0], DI, SHID);
  iw.weights_proj = view2(&ti[2], &idx_proj[0][0], NI, SHID);
  iw.k_norm_weight = view(&ti[3], idx_norm_w, 1, DI, 0, 0, 0);
  iw.k_norm_bias = view(&ti[4], idx_norm_b, 1, DI, 0, 0, 0);
  aar_sfa_impl_t* layer = NULL;
  ok &= expect_rejected(aar_sfa_impl_create_cp(&ic, &w, &iw, NULL, NULL, &layer),
                        "dcp_comm and pcp_comm are both NULL", "no communicator");
  CHECK(aar_sfa_impl_create_cp(&ic, &w, &iw, pcp ? NULL : comm, pcp ? comm : NULL, &layer));
  const DLManagedTensor* kv[3] = {view(&tn, &nope_cache[0][0][0][0], 4, SNB, SBS, 1, SL),
                                  view(&tr, &rope_cache[0][0][0][0], 4, SNB, SBS, 1, SR),
                                  view(&tx, &index_cache[0][0][0][0], 4, SNB * W, SBS, 1, DI)};

  /* One block table for every rank (block ids of each rank's own latent cache). */
  const int32_t table[REQS * SMAXB] = {3, 7, 1, 0, /**/ 5, 2, 6, 4};
  /* (request, new tokens) per step, decodes first. */
  const int steps[STEPS][2][2] = {{{0, 5}, {-1, 0}}, {{0, 1}, {-1, 0}}, {{0, 1}, {1, 9}},
                                  {{0, 1}, {1, 1}},  {{0, 1}, {1, 6}},  {{0, 1}, {1, 1}}};
  const latent_layer_t m = {SH, SHID, SL, SP, SR, SV, &w_q[0][0], &w_kva[0][0], g_kv, &w_kvb[0][0], &w_o[0][0],
                            inv_freq};
  int seen[REQS] = {0, 0};
  for (int step = 0; step < STEPS; ++step) {
    int32_t qsl[REQS + 1] = {0}, seq[REQS], rows[REQS * SMAXB];
    int n = 0, t = 0;
    for (int e = 0; e < 2 && steps[step][e][0] >= 0; ++e, ++n) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      fill(&x_hist[r][seen[r]][0], (size_t)q_len * SHID);
      memcpy(hidden + (size_t)t * SHID, x_hist[r][seen[r]], sizeof(float) * q_len * SHID);
      memcpy(rows + n * SMAXB, table + r * SMAXB, sizeof(int32_t) * SMAXB);
      seen[r] += q_len;
      t += q_len;
      qsl[n + 1] = t;
      seq[n] = seen[r];
    }
    aar_sfa_build_inputs_t in;
    aar_sfa_build_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = n + 1;
    in.seq_lens = seq;
    in.seq_lens_len = n;
    in.block_table = rows;
    in.block_table_len = n * SMAXB;
    in.block_table_stride = SMAXB;
    const aar_sfa_metadata_t* md = NULL;
    CHECK(aar_sfa_builder_build(builder, &in, &md));
    aar_sfa_metadata_info_t info;
    info.struct_size = sizeof(info);
    CHECK(aar_sfa_metadata_get_info(md, &info));
    /* This rank's rows: every token (DCP), or the builder's local rows of the global step. */
    size_t rows_here = (size_t)t;
    for (int i = 0; i < t; ++i) token_index[i] = i;
    if (pcp) CHECK(aar_sfa_builder_pcp_local_rows(builder, token_index, 2 * STOK, &rows_here));
    for (size_t i = 0; i < rows_here; ++i) {
      if (token_index[i] >= 0) {
        memcpy(local_hidden + i * SHID, hidden + (size_t)token_index[i] * SHID, sizeof(float) * SHID);
      } else {
        memset(local_hidden + i * SHID, 0, sizeof(float) * SHID);
      }
    }
    CHECK(aar_sfa_impl_forward(layer, view2(&th, local_hidden, (int64_t)rows_here, SHID), kv, 3, md,
                               view2(&to, local_out, (int64_t)rows_here, SHID), NULL));
    double worst = 0.0, ref[SHID];
    int checked = 0;
    for (size_t i = 0; i < rows_here; ++i) {
      const int g = token_index[i];
      if (g < 0) continue;
      int e = 0;
      while (g >= qsl[e + 1]) ++e;
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      latent_reference(&m, ref, &x_hist[r][0][0], seen[r] - q_len + (g - qsl[e]));
      for (int d = 0; d < SHID; ++d) {
        const double diff = fabs(ref[d] - local_out[i * SHID + d]);
        if (!(diff <= worst)) worst = diff;
      }
      ++checked;
    }
    printf("rank %d sfa %s step %d: %d requests, %d tokens (%d decodes, %d prefills), %d local rows (%d tokens), "
           "max |out - ref| = %.2e\n",
           rank, mode, step, n, t, info.num_decodes, info.num_prefills, (int)rows_here, checked, worst);
    ok = ok && checked > 0 && (pcp || checked == t);
    ok = ok && worst < 1e-4;
  }
  { /* The latent cache is sharded: this rank's holds exactly the tokens it owns (token x of a
     * request: owner (x / I) % W, local index (x / (W I)) I + x % I through the request's blocks).
     * The indexer cache is replicated: every token, at column j = x / bs of the replicated view,
     * block table[j / W] * W + j % W, offset x % bs. */
    int rows_ok = 1, owned = 0, written = 0, idx_ok = 1, idx_written = 0, total = 0;
    for (int b = 0; b < SNB; ++b) {
      for (int o = 0; o < SBS; ++o) written += row_written(nope_cache[b][o][0], SL);
    }
    for (int b = 0; b < SNB * W; ++b) {
      for (int o = 0; o < SBS; ++o) idx_written += row_written(index_cache[b][o][0], DI);
    }
    for (int r = 0; r < REQS; ++r) {
      for (int x = 0; x < seen[r]; ++x, ++total) {
        const int j = x / SBS;
        idx_ok &= row_written(index_cache[table[r * SMAXB + j / W] * W + j % W][x % SBS][0], DI);
        if ((x / INTERLEAVE) % W != rank) continue;
        const int local = (x / (W * INTERLEAVE)) * INTERLEAVE + x % INTERLEAVE;
        rows_ok &= row_written(nope_cache[table[r * SMAXB + local / SBS]][local % SBS][0], SL);
        ++owned;
      }
    }
    printf("rank %d sfa %s: %d latent cache rows written, %d tokens owned (of %d); %d indexer rows written%s\n", rank,
           mode, written, owned, total, idx_written,
           rows_ok && written == owned && idx_ok && idx_written == total ? "" : "  (UNEXPECTED)");
    ok = ok && rows_ok && written == owned && idx_ok && idx_written == total;
  }
  { /* Metadata of a single-rank builder on this 2-rank layer: refused before any collective. */
    aar_sfa_builder_t* single = NULL;
    CHECK(aar_sfa_builder_create(&bc, &single));
    const int32_t qsl[2] = {0, 1}, seq[1] = {1};
    aar_sfa_build_inputs_t in;
    aar_sfa_build_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = 2;
    in.seq_lens = seq;
    in.seq_lens_len = 1;
    in.block_table = table;
    in.block_table_len = SMAXB;
    in.block_table_stride = SMAXB;
    const aar_sfa_metadata_t* md = NULL;
    CHECK(aar_sfa_builder_build(single, &in, &md));
    ok &= expect_rejected(aar_sfa_impl_forward(layer, view2(&th, hidden, 1, SHID), kv, 3, md,
                                               view2(&to, out, 1, SHID), NULL),
                          pcp ? "the layer's pcp_comm has 2 ranks" : "has 2 ranks but the metadata was built without DCP",
                          "single-rank metadata");
    aar_sfa_builder_destroy(single);
  }
  aar_sfa_impl_destroy(layer);
  aar_sfa_builder_destroy(builder);
  return ok;
}

static int run_all(int rank, aar_cp_comm_t* comm) {
  const int ok = run_steps(rank, comm, 0);
  return run_steps(rank, comm, 1) && ok;
}

int main(int argc, char** argv) {
  return cp_main(argc, argv, W, DEADLINE_S, COMM_TIMEOUT_MS, run_all, "OK: both ranks match the float64 reference");
}
