/* MLA context parallelism through the C ABI: two processes (this program forks them,
 * c_cp_harness.h) join a gloo group over a TCP rendezvous on 127.0.0.1, then run one
 * DeepSeek-style MLA layer (no q-LoRA) over the same steps twice:
 *   - DCP 2 (decode context parallel): each rank builds its own view of the step
 *     (aar_mla_builder_create_cp: its KV shard, interleave 2); the layer
 *     (aar_mla_impl_create_cp with dcp_comm) all-gathers the decode queries, attends its shard
 *     and merges the partial results over the group, and gathers a chunked prefill's cached
 *     context from both shards; every rank returns every token's row; then graph mode: a
 *     decode bucket captured once (graph_decode_padding) and replayed for two decode steps
 *     (aar_graph_update_mla), the collectives inside the replay;
 *   - PCP 2 (prefill context parallel, KV sharded): every rank builds the global step and runs
 *     its local rows (aar_mla_builder_pcp_local_rows: the decodes, and the head and tail chunks
 *     of each prefill); the layer (pcp_comm) all-gathers the prefill KV and merges the decodes.
 * The steps: a prefill, a decode, a second request joining with a prefill, decodes of both, a
 * chunked prefill over cached context beside a decode, decodes; then (version 7,
 * aar_mla_builder_build_ext) a 1-token last chunk of request 1's prompt beside a decode, built
 * with the engine's is_prefilling flags (planned as a prefill on every rank, where the lengths
 * rule would make it a decode), and two draft-model steps (draft_step 0 and 1 over the same base
 * lengths: one token per request at position base + d). Every output row of every rank
 * is checked against the float64 un-absorbed layer over the request's whole history
 * (c_example.h's latent_reference; weights and tokens are the same on both ranks, drawn from
 * one seed), and each rank's caches hold exactly the tokens it owns. A few bad calls are
 * rejected by name.
 *
 *   c_mla_cp                       forks ranks 0 and 1, waits at most 120 s
 *   c_mla_cp <rank> <port>         one rank, for running the two by hand */
#define _POSIX_C_SOURCE 200809L
#include "c_cp_harness.h"

enum { W = 2, INTERLEAVE = 2, REQS = 2 };
enum { MH = 2, MHID = 32, ML = 16, MP = 8, MR = 8, MV = 8, MBS = 16, MNB = 8, MMAXB = 4, MTOK = 24 };
enum { STEPS = 9, FLAG_STEP = 6, DRAFT_STEP = 7 }; /* steps 6..8: aar_mla_builder_build_ext */
enum { DEADLINE_S = 120, COMM_TIMEOUT_MS = 20000 };

static float w_q[MH * (MP + MR)][MHID], w_kva[ML + MR][MHID], g_kv[ML], w_kvb[MH * (MP + MV)][ML],
    w_o[MHID][MH * MV];
static float x_hist[REQS][MTOK][MHID]; /* hidden states each request has seen (global) */
static double inv_freq[MR / 2];
static float nope_cache[MNB][MBS][1][ML], rope_cache[MNB][MBS][1][MR]; /* this rank's shard */
static float cos_t[MMAXB * MBS][MR], sin_t[MMAXB * MBS][MR];

static void make_model(void) {
  fill(&w_q[0][0], sizeof(w_q) / sizeof(float));
  fill(&w_kva[0][0], sizeof(w_kva) / sizeof(float));
  fill(&w_kvb[0][0], sizeof(w_kvb) / sizeof(float));
  fill(&w_o[0][0], sizeof(w_o) / sizeof(float));
  for (int i = 0; i < ML; ++i) g_kv[i] = 1.0f + 0.1f * uniform();
  /* Tables (max_position, R), both halves equal: column i has frequency i mod R/2. */
  for (int i = 0; i < MR / 2; ++i) inv_freq[i] = pow(10000.0, -2.0 * i / MR);
  for (int p = 0; p < MMAXB * MBS; ++p) {
    for (int i = 0; i < MR; ++i) {
      cos_t[p][i] = (float)cos(p * inv_freq[i % (MR / 2)]);
      sin_t[p][i] = (float)sin(p * inv_freq[i % (MR / 2)]);
    }
  }
}

/* DCP graph mode: a decode bucket of both requests captured once on static buffers (the builder
 * has graph_decode_padding: the build pads the step to the bucket with dummy requests), then two
 * decode steps built, updated (aar_graph_update_mla) and replayed, the collectives inside the
 * replay, each checked against the float64 reference. */
static int dcp_graph(int rank, aar_cp_comm_t* comm, aar_mla_builder_t* builder, aar_mla_impl_t* layer,
                     DLManagedTensor* nc, DLManagedTensor* rc, const int32_t* table, int* mseen) {
  enum { BUCKET = 4 };
  static float hs[BUCKET * MHID], os[BUCKET * MHID];
  tensor_t th, to;
  DLManagedTensor* dh = view2(&th, hs, BUCKET, MHID);
  DLManagedTensor* dout = view2(&to, os, BUCKET, MHID);
  const latent_layer_t m = {MH, MHID, ML, MP, MR, MV, &w_q[0][0], &w_kva[0][0], g_kv, &w_kvb[0][0], &w_o[0][0],
                            inv_freq};
  int32_t qsl[REQS + 1] = {0, 1, 2}, seq[REQS], rows[REQS * MMAXB];
  memcpy(rows, table, sizeof(int32_t) * REQS * MMAXB);
  aar_mla_build_inputs_t in;
  aar_mla_build_inputs_init(&in);
  in.query_start_loc = qsl;
  in.query_start_loc_len = REQS + 1;
  in.seq_lens = seq;
  in.seq_lens_len = REQS;
  in.block_table = rows;
  in.block_table_len = REQS * MMAXB;
  in.block_table_stride = MMAXB;
  in.num_input_tokens = BUCKET;
  in.attn_state = AAR_STATE_DECODE_ONLY;
  int ok = 1;
  aar_graph_params_t* g = NULL;
  CHECK(aar_graph_params_create("recording", NULL, 0, &g));
  { /* The capture's build: the next step's shape; nothing runs, nothing is appended. */
    for (int r = 0; r < REQS; ++r) seq[r] = mseen[r] + 1;
    const aar_mla_metadata_t* md = NULL;
    CHECK(aar_mla_builder_build(builder, &in, &md));
    CHECK(aar_graph_begin_capture(g, BUCKET));
    CHECK(aar_mla_impl_forward(layer, dh, nc, rc, md, dout));
    CHECK(aar_graph_end_capture(g));
  }
  for (int rep = 0; rep < 2; ++rep) {
    memset(hs, 0, sizeof(hs));
    for (int r = 0; r < REQS; ++r) {
      fill(&x_hist[r][mseen[r]][0], MHID);
      memcpy(hs + (size_t)r * MHID, x_hist[r][mseen[r]], sizeof(float) * MHID);
      seq[r] = ++mseen[r];
    }
    for (int i = 0; i < BUCKET * MHID; ++i) os[i] = NAN;
    const aar_mla_metadata_t* md = NULL;
    CHECK(aar_mla_builder_build(builder, &in, &md));
    CHECK(aar_graph_update_mla(g, BUCKET, md));
    aar_cp_comm_info_t before, after;
    before.struct_size = after.struct_size = sizeof(before);
    CHECK(aar_cp_comm_get_info(comm, &before));
    CHECK(aar_graph_replay(g, BUCKET));
    CHECK(aar_cp_comm_get_info(comm, &after));
    double worst = 0.0, ref[MHID];
    for (int r = 0; r < REQS; ++r) {
      latent_reference(&m, ref, &x_hist[r][0][0], mseen[r] - 1);
      for (int d = 0; d < MHID; ++d) {
        const double diff = fabs(ref[d] - os[(size_t)r * MHID + d]);
        if (!(diff <= worst)) worst = diff;
      }
    }
    printf("rank %d mla dcp decode, graph replay: %d tokens in a bucket of %d, %lld collectives, "
           "max |out - ref| = %.2e\n",
           rank, REQS, BUCKET, (long long)(after.calls - before.calls), worst);
    ok = ok && worst < 1e-4 && after.calls > before.calls;
  }
  aar_graph_params_destroy(g);
  return ok;
}

/* One layer over the steps: DCP 2 (pcp 0) or PCP 2 (pcp 1), the same checks. */
static int run_steps(int rank, aar_cp_comm_t* comm, int pcp) {
  static float hidden[MTOK * MHID], out[MTOK * MHID], local_hidden[2 * MTOK * MHID], local_out[2 * MTOK * MHID];
  static int32_t token_index[2 * MTOK];
  const char* mode = pcp ? "pcp" : "dcp";
  tensor_t tw[5], tcos, tsin, tn, tr, th, to;
  int ok = 1;
  make_model();
  memset(x_hist, 0, sizeof(x_hist));
  memset(nope_cache, 0, sizeof(nope_cache));
  memset(rope_cache, 0, sizeof(rope_cache));

  aar_mla_builder_config_t bc;
  aar_mla_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = MTOK;
  bc.max_blocks_per_req = MMAXB;
  bc.block_size = MBS;
  bc.num_blocks = MNB;
  bc.cos_table = view2(&tcos, &cos_t[0][0], MMAXB * MBS, MR);
  bc.sin_table = view2(&tsin, &sin_t[0][0], MMAXB * MBS, MR);
  bc.graph_decode_padding = !pcp; /* DCP: decode buckets padded for graph mode (eager steps unpadded) */
  aar_mla_builder_cp_t cp;
  aar_mla_builder_cp_init(&cp);
  if (pcp) {
    cp.pcp_world_size = W;
    cp.pcp_rank = rank;
  } else {
    cp.dcp_world_size = W;
    cp.dcp_rank = rank;
  }
  cp.interleave = INTERLEAVE;
  aar_mla_builder_t* builder = NULL;
  if (!pcp) {
    aar_mla_builder_cp_t bad = cp;
    bad.dcp_rank = W;
    ok &= expect_rejected(aar_mla_builder_create_cp(&bc, &bad, &builder), "cp->dcp_rank=2 is out of range",
                          "dcp_rank 2 of 2");
    bad = cp;
    bad.interleave = 3;
    ok &= expect_rejected(aar_mla_builder_create_cp(&bc, &bad, &builder), "cp->interleave=3", "interleave 3");
  }
  CHECK(aar_mla_builder_create_cp(&bc, &cp, &builder));

  aar_mla_impl_config_t ic;
  aar_mla_impl_config_init(&ic);
  ic.num_heads = MH;
  ic.hidden_size = MHID;
  ic.kv_lora_rank = ML;
  ic.qk_nope_head_dim = MP;
  ic.qk_rope_head_dim = MR;
  ic.v_head_dim = MV;
  aar_mla_weights_t w;
  aar_mla_weights_init(&w);
  w.q_proj = view2(&tw[0], &w_q[0][0], MH * (MP + MR), MHID);
  w.kv_a_proj_with_mqa = view2(&tw[1], &w_kva[0][0], ML + MR, MHID);
  w.kv_a_layernorm = view(&tw[2], g_kv, 1, ML, 0, 0, 0);
  w.kv_b_proj = view2(&tw[3], &w_kvb[0][0], MH * (MP + MV), ML);
  w.o_proj = view2(&tw[4], &w_o[0][0], MHID, MH * MV);
  aar_mla_impl_t* layer = NULL;
  if (!pcp) {
    ok &= expect_rejected(aar_mla_impl_create_cp(&ic, &w, NULL, NULL, &layer),
                          "dcp_comm and pcp_comm are both NULL", "no communicator");
  }
  CHECK(aar_mla_impl_create_cp(&ic, &w, pcp ? NULL : comm, pcp ? comm : NULL, &layer));
  DLManagedTensor* nc = view(&tn, &nope_cache[0][0][0][0], 4, MNB, MBS, 1, ML);
  DLManagedTensor* rc = view(&tr, &rope_cache[0][0][0][0], 4, MNB, MBS, 1, MR);

  /* One block table for every rank (block ids of each rank's own caches). */
  const int32_t table[REQS * MMAXB] = {3, 7, 1, 0, /**/ 5, 2, 6, 4};
  /* (request, new tokens) per step, decodes first. */
  const int steps[STEPS][2][2] = {{{0, 5}, {-1, 0}}, {{0, 1}, {-1, 0}}, {{0, 1}, {1, 9}},
                                  {{0, 1}, {1, 1}},  {{0, 1}, {1, 6}},  {{0, 1}, {1, 1}},
                                  {{0, 1}, {1, 1}},  {{0, 1}, {1, 1}},  {{0, 1}, {1, 1}}};
  int mseen[REQS] = {0, 0}, base[REQS] = {0, 0};
  for (int step = 0; step < STEPS; ++step) {
    int32_t qsl[REQS + 1] = {0}, seq[REQS], rows[REQS * MMAXB];
    int n = 0, t = 0;
    if (step == DRAFT_STEP) memcpy(base, mseen, sizeof(base)); /* the draft steps' base lengths */
    for (int e = 0; e < 2 && steps[step][e][0] >= 0; ++e, ++n) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      fill(&x_hist[r][mseen[r]][0], (size_t)q_len * MHID);
      memcpy(hidden + (size_t)t * MHID, x_hist[r][mseen[r]], sizeof(float) * q_len * MHID);
      memcpy(rows + n * MMAXB, table + r * MMAXB, sizeof(int32_t) * MMAXB);
      mseen[r] += q_len;
      t += q_len;
      qsl[n + 1] = t;
      seq[n] = step >= DRAFT_STEP ? base[r] : mseen[r];
    }
    aar_mla_build_inputs_t in;
    aar_mla_build_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = n + 1;
    in.seq_lens = seq;
    in.seq_lens_len = n;
    in.block_table = rows;
    in.block_table_len = n * MMAXB;
    in.block_table_stride = MMAXB;
    const aar_mla_metadata_t* md = NULL;
    const uint8_t flags[REQS] = {0, 1}; /* request 1 is still prefilling its prompt */
    aar_mla_build_inputs_ext_t ext;
    aar_mla_build_inputs_ext_init(&ext);
    if (step == FLAG_STEP) {
      ext.is_prefilling = flags;
      ext.is_prefilling_len = REQS;
    } else if (step >= DRAFT_STEP) {
      ext.draft_step = step - DRAFT_STEP;
    }
    if (step < FLAG_STEP) {
      CHECK(aar_mla_builder_build(builder, &in, &md));
    } else {
      CHECK(aar_mla_builder_build_ext(builder, &in, &ext, &md));
    }
    aar_mla_metadata_info_t info;
    info.struct_size = sizeof(info);
    CHECK(aar_mla_metadata_get_info(md, &info));
    if (step == FLAG_STEP) ok = ok && info.num_prefills == 1; /* the flag, not the lengths rule */
    if (step >= DRAFT_STEP) ok = ok && info.num_prefills == 0 && info.num_decodes == REQS;
    /* This rank's rows: every token (DCP), or the builder's local rows of the global step
     * (PCP: the decodes and the head and tail chunks of each prefill, padding rows -1). */
    size_t rows_here = (size_t)t;
    for (int i = 0; i < t; ++i) token_index[i] = i;
    if (pcp) CHECK(aar_mla_builder_pcp_local_rows(builder, token_index, 2 * MTOK, &rows_here));
    for (size_t i = 0; i < rows_here; ++i) {
      if (token_index[i] >= 0) {
        memcpy(local_hidden + i * MHID, hidden + (size_t)token_index[i] * MHID, sizeof(float) * MHID);
      } else {
        memset(local_hidden + i * MHID, 0, sizeof(float) * MHID);
      }
    }
    CHECK(aar_mla_impl_forward(layer, view2(&th, local_hidden, (int64_t)rows_here, MHID), nc, rc, md,
                               view2(&to, local_out, (int64_t)rows_here, MHID)));
    double worst = 0.0, ref[MHID];
    int checked = 0;
    const latent_layer_t m = {MH, MHID, ML, MP, MR, MV, &w_q[0][0], &w_kva[0][0], g_kv, &w_kvb[0][0], &w_o[0][0],
                              inv_freq};
    for (size_t i = 0; i < rows_here; ++i) {
      const int g = token_index[i];
      if (g < 0) continue;
      int e = 0;
      while (g >= qsl[e + 1]) ++e;
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      latent_reference(&m, ref, &x_hist[r][0][0], mseen[r] - q_len + (g - qsl[e]));
      for (int d = 0; d < MHID; ++d) {
        const double diff = fabs(ref[d] - local_out[i * MHID + d]);
        if (diff > worst) worst = diff;
      }
      ++checked;
    }
    printf("rank %d mla %s step %d%s: %d requests, %d tokens (%d decodes, %d prefills), %d local rows (%d tokens), "
           "max |out - ref| = %.2e\n",
           rank, mode, step, step == FLAG_STEP ? " (is_prefilling)" : step >= DRAFT_STEP ? " (draft)" : "", n, t,
           info.num_decodes, info.num_prefills, (int)rows_here, checked, worst);
    ok = ok && checked > 0;
    ok = ok && worst < 1e-4;
  }
  if (!pcp) ok = dcp_graph(rank, comm, builder, layer, nc, rc, table, mseen) && ok;
  { /* The KV is sharded: this rank's caches hold exactly the tokens it owns (token x of a
     * request: owner (x / I) % W, local index (x / (W I)) I + x % I through the request's
     * blocks); every other row is still zero. */
    int rows_ok = 1, owned = 0, written = 0;
    for (int b = 0; b < MNB; ++b) {
      for (int o = 0; o < MBS; ++o) {
        int nz = 0;
        for (int i = 0; i < ML; ++i) nz |= nope_cache[b][o][0][i] != 0.0f;
        written += nz;
      }
    }
    for (int r = 0; r < REQS; ++r) {
      for (int x = 0; x < mseen[r]; ++x) {
        if ((x / INTERLEAVE) % W != rank) continue;
        const int local = (x / (W * INTERLEAVE)) * INTERLEAVE + x % INTERLEAVE;
        const int b = table[r * MMAXB + local / MBS], o = local % MBS;
        int nz = 0;
        for (int i = 0; i < ML; ++i) nz |= nope_cache[b][o][0][i] != 0.0f;
        rows_ok &= nz;
        ++owned;
      }
    }
    printf("rank %d mla %s: %d cache rows written, %d tokens owned (of %d)%s\n", rank, mode, written, owned,
           mseen[0] + mseen[1],
           rows_ok && written == owned ? "" : "  (UNEXPECTED)");
    ok = ok && rows_ok && written == owned;
  }
  if (!pcp) { /* Metadata of a single-rank builder on this 2-rank layer: refused before any collective. */
    aar_mla_builder_t* single = NULL;
    CHECK(aar_mla_builder_create(&bc, &single));
    const int32_t qsl[2] = {0, 1}, seq[1] = {1};
    aar_mla_build_inputs_t in;
    aar_mla_build_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = 2;
    in.seq_lens = seq;
    in.seq_lens_len = 1;
    in.block_table = table;
    in.block_table_len = MMAXB;
    in.block_table_stride = MMAXB;
    const aar_mla_metadata_t* md = NULL;
    CHECK(aar_mla_builder_build(single, &in, &md));
    ok &= expect_rejected(aar_mla_impl_forward(layer, view2(&th, hidden, 1, MHID), nc, rc, md,
                                               view2(&to, out, 1, MHID)),
                          "has 2 ranks but the metadata was built without DCP", "single-rank metadata");
    aar_mla_builder_destroy(single);
  }
  aar_mla_impl_destroy(layer);
  aar_mla_builder_destroy(builder);
  return ok;
}

static int run_all(int rank, aar_cp_comm_t* comm) {
  const int ok = run_steps(rank, comm, 0);
  return run_steps(rank, comm, 1) && ok;
}

int main(int argc, char** argv) {
  return cp_main(argc, argv, W, DEADLINE_S, COMM_TIMEOUT_MS, run_all, "OK: both ranks match the float64 reference");
}
