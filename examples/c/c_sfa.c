/* A C11 engine running two SFA (DeepSeek-V3.2 sparse attention) layers through
 * the C ABI (ascend_attn_rt/c_api.h): one SFA metadata builder, the model's
 * top-k buffer, a layer with a lightning indexer that writes its selection into
 * the buffer (use_index_cache) and a layer without one that reuses it. Two
 * requests: a prefill, decodes, the second request joining late.
 *
 * The indexer keeps index_topk tokens per query; with index_topk at least the
 * longest context it keeps every causal position, so the check is exact: each
 * query's selection in the buffer is the set {0, ..., pos}, and both layers'
 * outputs equal the dense latent attention computed in float64 here
 * (c_example.h). Then a few bad calls, each rejected by name with nothing
 * written.
 *
 * Build: examples/c/CMakeLists.txt; ctest `example_c_sfa` runs it. */
#include "c_example.h"

enum { H = 2, HID = 32, L = 16, P = 8, R = 8, V = 8, BS = 16, NB = 8, MAXB = 4, TOK = 24, REQS = 2 };
enum { NI = 2, DI = 16, TOPK = MAXB * BS, STEPS = 4 };

typedef struct {
  float w_q[H * (P + R)][HID], w_kva[L + R][HID], g_kv[L], w_kvb[H * (P + V)][L], w_o[HID][H * V];
  float nope[NB][BS][1][L], rope[NB][BS][1][R];
  tensor_t t[5], tn, tr;
  aar_mla_weights_t weights;
  latent_layer_t ref;
  aar_sfa_impl_t* impl;
} layer_t;

static layer_t layers[2];
static float idx_wq_b[NI * DI][HID], idx_wk[DI][HID], idx_proj[NI][HID], idx_norm_w[DI], idx_norm_b[DI];
static float idx_cache[NB][BS][1][DI];
static float x_hist[REQS][TOK][HID]; /* hidden states each request has seen */
static double inv_freq[R / 2];

static void init_layer(layer_t* y, int has_indexer) {
  fill(&y->w_q[0][0], sizeof(y->w_q) / sizeof(float));
  fill(&y->w_kva[0][0], sizeof(y->w_kva) / sizeof(float));
  fill(&y->w_kvb[0][0], sizeof(y->w_kvb) / sizeof(float));
  fill(&y->w_o[0][0], sizeof(y->w_o) / sizeof(float));
  for (int i = 0; i < L; ++i) y->g_kv[i] = 1.0f + 0.1f * uniform();
  aar_mla_weights_init(&y->weights);
  y->weights.q_proj = view2(&y->t[0], &y->w_q[0][0], H * (P + R), HID);
  y->weights.kv_a_proj_with_mqa = view2(&y->t[1], &y->w_kva[0][0], L + R, HID);
  y->weights.kv_a_layernorm = view(&y->t[2], y->g_kv, 1, L, 0, 0, 0);
  y->weights.kv_b_proj = view2(&y->t[3], &y->w_kvb[0][0], H * (P + V), L);
  y->weights.o_proj = view2(&y->t[4], &y->w_o[0][0], HID, H * V);
  const latent_layer_t ref = {H, HID, L, P, R, V, &y->w_q[0][0], &y->w_kva[0][0], y->g_kv, &y->w_kvb[0][0],
                              &y->w_o[0][0], inv_freq};
  y->ref = ref;

  aar_sfa_impl_config_t ic;
  aar_sfa_impl_config_init(&ic);
  ic.num_heads = H;
  ic.hidden_size = HID;
  ic.kv_lora_rank = L;
  ic.qk_nope_head_dim = P;
  ic.qk_rope_head_dim = R;
  ic.v_head_dim = V;
  ic.has_indexer = has_indexer;
  ic.use_index_cache = has_indexer;
  ic.index_n_heads = NI;
  ic.index_head_dim = DI;
  ic.index_topk = TOPK;
  aar_sfa_indexer_weights_t iw;
  tensor_t ti[5];
  aar_sfa_indexer_weights_init(&iw);
  iw.wq_b = view2(&ti[0], &idx_wq_b[0][0], NI * DI, HID);
  iw.wk = view2(&ti[1], &idx_wk[0][0], DI, HID);
  iw.weights_proj = view2(&ti[2], &idx_proj[0][0], NI, HID);
  iw.k_norm_weight = view(&ti[3], idx_norm_w, 1, DI, 0, 0, 0);
  iw.k_norm_bias = view(&ti[4], idx_norm_b, 1, DI, 0, 0, 0);
  /* The weights stay borrowed until destroy; the DLManagedTensor structs only during create. */
  CHECK(aar_sfa_impl_create(&ic, &y->weights, has_indexer ? &iw : NULL, &y->impl));
}

/* 1 when the first n entries of row are each of 0..want-1 once and the rest -1. */
static int selects_all(const int32_t* row, int n, int want) {
  int count[TOPK] = {0};
  for (int i = 0; i < n; ++i) {
    if (row[i] < -1 || row[i] >= want) return 0;
    if (row[i] >= 0 && count[row[i]]++ > 0) return 0;
  }
  for (int j = 0; j < want; ++j) {
    if (count[j] != 1) return 0;
  }
  return 1;
}

int main(void) {
  static float cos_t[MAXB * BS][R], sin_t[MAXB * BS][R], hidden[TOK * HID], out[2][TOK * HID];
  tensor_t tcos, tsin, th, to[2], tidx;
  int ok = 1;
  if (aar_c_api_version() != AAR_C_API_VERSION) {
    fprintf(stderr, "c_api.h is version %d, libascend_attn_rt_c %d\n", AAR_C_API_VERSION, aar_c_api_version());
    return 1;
  }
  /* Tables (max_position, R), both halves equal: column i has frequency i mod R/2. */
  for (int i = 0; i < R / 2; ++i) inv_freq[i] = pow(10000.0, -2.0 * i / R);
  for (int p = 0; p < MAXB * BS; ++p) {
    for (int i = 0; i < R; ++i) {
      cos_t[p][i] = (float)cos(p * inv_freq[i % (R / 2)]);
      sin_t[p][i] = (float)sin(p * inv_freq[i % (R / 2)]);
    }
  }
  fill(&idx_wq_b[0][0], sizeof(idx_wq_b) / sizeof(float));
  fill(&idx_wk[0][0], sizeof(idx_wk) / sizeof(float));
  fill(&idx_proj[0][0], sizeof(idx_proj) / sizeof(float));
  for (int i = 0; i < DI; ++i) idx_norm_w[i] = 1.0f + 0.1f * uniform(), idx_norm_b[i] = 0.1f * uniform();
  init_layer(&layers[0], 1);
  init_layer(&layers[1], 0);

  aar_sfa_builder_config_t bc;
  aar_sfa_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = TOK;
  bc.max_blocks_per_req = MAXB;
  bc.block_size = BS;
  bc.num_blocks = NB;
  bc.cos_table = view2(&tcos, &cos_t[0][0], MAXB * BS, R);
  bc.sin_table = view2(&tsin, &sin_t[0][0], MAXB * BS, R);
  aar_sfa_builder_t* builder = NULL;
  CHECK(aar_sfa_builder_create(&bc, &builder));
  aar_sfa_topk_buffer_t* topk = NULL;
  const DLDevice host = {kDLCPU, 0};
  CHECK(aar_sfa_topk_buffer_create(TOK, TOPK, host, &topk));
  DLManagedTensor* buf = NULL; /* the buffer, lent: read after each step, freed at the end */
  CHECK(aar_sfa_topk_buffer_tensor(topk, &buf));
  const int32_t* sel = (const int32_t*)((char*)buf->dl_tensor.data + buf->dl_tensor.byte_offset);

  /* The cache tuples: (latent, rope, indexer k) for the indexer layer, (latent, rope) for the other. */
  const DLManagedTensor* kv[2][3];
  for (int l = 0; l < 2; ++l) {
    kv[l][0] = view(&layers[l].tn, &layers[l].nope[0][0][0][0], 4, NB, BS, 1, L);
    kv[l][1] = view(&layers[l].tr, &layers[l].rope[0][0][0][0], 4, NB, BS, 1, R);
  }
  kv[0][2] = view(&tidx, &idx_cache[0][0][0][0], 4, NB, BS, 1, DI);

  const int32_t table[REQS * MAXB] = {3, 7, 1, 0, /**/ 5, 2, 6, 0};
  /* (request, new tokens) per step, decodes first. */
  const int steps[STEPS][2][2] = {{{0, 5}, {-1, 0}}, {{0, 1}, {-1, 0}}, {{0, 1}, {1, 9}}, {{0, 1}, {1, 1}}};
  int seen[REQS] = {0, 0};
  const aar_sfa_metadata_t* md = NULL;
  for (int step = 0; step < STEPS; ++step) {
    int32_t qsl[REQS + 1] = {0}, seq[REQS], rows[REQS * MAXB];
    int n = 0, t = 0;
    for (int e = 0; e < 2 && steps[step][e][0] >= 0; ++e, ++n) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      fill(&x_hist[r][seen[r]][0], (size_t)q_len * HID);
      memcpy(hidden + (size_t)t * HID, x_hist[r][seen[r]], sizeof(float) * q_len * HID);
      memcpy(rows + n * MAXB, table + r * MAXB, sizeof(int32_t) * MAXB);
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
    in.block_table_len = n * MAXB;
    in.block_table_stride = MAXB;
    CHECK(aar_sfa_builder_build(builder, &in, &md));
    aar_sfa_metadata_info_t info;
    info.struct_size = sizeof(info);
    CHECK(aar_sfa_metadata_get_info(md, &info));
    /* Both layers read the same hidden states (their reference is per layer). */
    for (int l = 0; l < 2; ++l) {
      CHECK(aar_sfa_impl_forward(layers[l].impl, view2(&th, hidden, t, HID), kv[l], l == 0 ? 3 : 2, md,
                                 view2(&to[l], out[l], t, HID), topk));
    }
    double worst[2] = {0.0, 0.0}, ref[HID];
    int row = 0, selections_ok = 1;
    for (int e = 0; e < n; ++e) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      for (int i = 0; i < q_len; ++i, ++row) {
        const int pos = seen[r] - q_len + i;
        selections_ok = selections_ok && selects_all(sel + (size_t)row * TOPK, TOPK, pos + 1);
        for (int l = 0; l < 2; ++l) {
          latent_reference(&layers[l].ref, ref, &x_hist[r][0][0], pos);
          for (int d = 0; d < HID; ++d) {
            const double diff = fabs(ref[d] - out[l][(size_t)row * HID + d]);
            if (diff > worst[l]) worst[l] = diff;
          }
        }
      }
    }
    printf("sfa step %d: %d requests, %d tokens (%d decodes, %d prefills), selections %s, max |out - ref| = %.2e "
           "(indexer layer), %.2e (reusing layer)\n",
           step, n, t, info.num_decodes, info.num_prefills, selections_ok ? "causal and complete" : "WRONG",
           worst[0], worst[1]);
    ok = ok && selections_ok && worst[0] < 1e-4 && worst[1] < 1e-4;
  }

  /* Bad input: a status and a message naming the argument; nothing written. */
  static float nope_before[NB][BS][1][L], idx_before[NB][BS][1][DI], out_before[TOK * HID];
  memcpy(nope_before, layers[0].nope, sizeof(nope_before));
  memcpy(idx_before, idx_cache, sizeof(idx_before));
  memcpy(out_before, out[0], sizeof(out_before));
  DLManagedTensor* h2 = view2(&th, hidden, 2, HID);
  DLManagedTensor* o2 = view2(&to[0], out[0], 2, HID);
  ok = ok && expect_rejected(aar_sfa_impl_forward(layers[0].impl, h2, kv[0], 2, md, o2, topk),
                             "composed tuple of 3 tensors", "tuple without indexer cache");
  ok = ok && expect_rejected(aar_sfa_impl_forward(layers[1].impl, h2, kv[1], 2, md, o2, NULL), "topk must be given",
                             "reusing layer, no buffer");
  ok = ok && expect_rejected(aar_sfa_impl_forward(layers[0].impl, h2, kv[0], 3, (const aar_sfa_metadata_t*)topk, o2,
                                                  topk),
                             "metadata is an aar_sfa_topk_buffer_t", "buffer given as metadata");
  ok = ok && expect_rejected(aar_sfa_topk_buffer_create(TOK, 0, host, &topk), "index_topk must be positive",
                             "top-k of 0");
  ok = ok && memcmp(nope_before, layers[0].nope, sizeof(nope_before)) == 0 &&
       memcmp(idx_before, idx_cache, sizeof(idx_before)) == 0 && memcmp(out_before, out[0], sizeof(out_before)) == 0;

  buf->deleter(buf);
  for (int l = 0; l < 2; ++l) aar_sfa_impl_destroy(layers[l].impl);
  aar_sfa_topk_buffer_destroy(topk);
  aar_sfa_builder_destroy(builder);
  printf("%s\n", ok ? "c_sfa: OK" : "c_sfa: FAILED");
  return ok ? 0 : 1;
}
