/* A C11 engine calling the runtime through its C ABI (ascend_attn_rt/c_api.h):
 * one paged KV cache, a GQA metadata builder and layer; a prefill of two
 * requests, two eager decode steps, then two decode steps through graph mode
 * (a captured bucket, updated and replayed each step); then an MLA layer with
 * its builder (prefill, decodes, a request joining late). Every step's output
 * is checked against a float64 attention computed here with plain loops. And a
 * few bad calls, each rejected with a status and a message naming the argument.
 *
 * Build: examples/c/CMakeLists.txt (find_package(ascend_attn_rt COMPONENTS
 * c_api)); ctest `example_c_attention` runs it. */
#include "c_example.h"

enum { H = 4, HKV = 2, D = 32, BS = 16, NB = 16, REQS = 2, MAXTOK = 64, WIDTH = 4 };

/* Every K/V row each request has seen, in order (the float64 reference reads these). */
static float k_hist[REQS][MAXTOK][HKV][D], v_hist[REQS][MAXTOK][HKV][D];
static int seen[REQS];

/* Causal attention of the step's tokens over each request's history, in double;
 * returns max |out - ref|. q/out rows: request after request. */
static double check(const float* q, const float* out, const int* q_len) {
  double worst = 0.0;
  int row = 0;
  for (int r = 0; r < REQS; ++r) {
    for (int i = 0; i < q_len[r]; ++i, ++row) {
      const int pos = seen[r] - q_len[r] + i;
      const double diff = gqa_row_diff(q + (size_t)row * H * D, &k_hist[r][0][0][0], &v_hist[r][0][0][0], pos + 1, H,
                                       HKV, D, out + (size_t)row * H * D);
      if (diff > worst) worst = diff;
    }
  }
  return worst;
}

/* Appends the step's new K/V rows to the histories. */
static void remember(const float* k, const float* v, const int* q_len) {
  int row = 0;
  for (int r = 0; r < REQS; ++r) {
    for (int i = 0; i < q_len[r]; ++i, ++row) {
      memcpy(k_hist[r][seen[r]], k + (size_t)row * HKV * D, sizeof(float) * HKV * D);
      memcpy(v_hist[r][seen[r]], v + (size_t)row * HKV * D, sizeof(float) * HKV * D);
      ++seen[r];
    }
  }
}

static float k_cache[NB][BS][HKV][D], v_cache[NB][BS][HKV][D];

/* ------------------------------------------------------------------ MLA
 * One DeepSeek-style MLA layer (no q-LoRA): two requests, a prefill, decodes,
 * the second request joining late (decodes first in every step). The float64
 * reference runs the un-absorbed equations from the weights: projections,
 * RMSNorm of the latent, interleaved (GPT-J) RoPE, causal softmax, o_proj. */
enum { MH = 2, MHID = 32, ML = 16, MP = 8, MR = 8, MV = 8, MBS = 16, MNB = 8, MMAXB = 4, MTOK = 24 };

static float w_q[MH * (MP + MR)][MHID], w_kva[ML + MR][MHID], g_kv[ML], w_kvb[MH * (MP + MV)][ML],
    w_o[MHID][MH * MV];
static float x_hist[REQS][MTOK][MHID]; /* hidden states each request has seen */
static double inv_freq[MR / 2];

/* Output row (MHID) of the token at position `pos` of request r, attending positions [0, pos]. */
static void mla_reference(double* out, int r, int pos) {
  const latent_layer_t m = {MH, MHID, ML, MP, MR, MV, &w_q[0][0], &w_kva[0][0], g_kv, &w_kvb[0][0], &w_o[0][0],
                            inv_freq};
  latent_reference(&m, out, &x_hist[r][0][0], pos);
}

static float nope_cache[MNB][MBS][1][ML], rope_cache[MNB][MBS][1][MR];

static int run_mla(void) {
  static float cos_t[MMAXB * MBS][MR], sin_t[MMAXB * MBS][MR], hidden[MTOK * MHID], out[MTOK * MHID];
  tensor_t tw[5], tcos, tsin, tn, tr, th, to;
  int ok = 1;
  fill(&w_q[0][0], sizeof(w_q) / sizeof(float));
  fill(&w_kva[0][0], sizeof(w_kva) / sizeof(float));
  fill(&w_kvb[0][0], sizeof(w_kvb) / sizeof(float));
  fill(&w_o[0][0], sizeof(w_o) / sizeof(float));
  for (int i = 0; i < ML; ++i) g_kv[i] = 1.0f + 0.1f * uniform();
  /* Tables (max_position, R), both halves equal (spec 6.1): column i has frequency i mod R/2. */
  for (int i = 0; i < MR / 2; ++i) inv_freq[i] = pow(10000.0, -2.0 * i / MR);
  for (int p = 0; p < MMAXB * MBS; ++p) {
    for (int i = 0; i < MR; ++i) {
      cos_t[p][i] = (float)cos(p * inv_freq[i % (MR / 2)]);
      sin_t[p][i] = (float)sin(p * inv_freq[i % (MR / 2)]);
    }
  }

  aar_mla_builder_config_t bc;
  aar_mla_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = MTOK;
  bc.max_blocks_per_req = MMAXB;
  bc.block_size = MBS;
  bc.num_blocks = MNB;
  bc.cos_table = view2(&tcos, &cos_t[0][0], MMAXB * MBS, MR);
  bc.sin_table = view2(&tsin, &sin_t[0][0], MMAXB * MBS, MR);
  aar_mla_builder_t* builder = NULL;
  CHECK(aar_mla_builder_create(&bc, &builder));

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
  CHECK(aar_mla_impl_create(&ic, &w, &layer));
  DLManagedTensor* nc = view(&tn, &nope_cache[0][0][0][0], 4, MNB, MBS, 1, ML);
  DLManagedTensor* rc = view(&tr, &rope_cache[0][0][0][0], 4, MNB, MBS, 1, MR);

  const int32_t table[REQS * MMAXB] = {3, 7, 1, 0, /**/ 5, 2, 6, 0};
  /* (request, new tokens) per step, decodes first. */
  const int steps[4][2][2] = {{{0, 5}, {-1, 0}}, {{0, 1}, {-1, 0}}, {{0, 1}, {1, 9}}, {{0, 1}, {1, 1}}};
  int mseen[REQS] = {0, 0};
  for (int step = 0; step < 4; ++step) {
    int32_t qsl[REQS + 1] = {0}, seq[REQS], rows[REQS * MMAXB];
    int n = 0, t = 0;
    for (int e = 0; e < 2 && steps[step][e][0] >= 0; ++e, ++n) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      fill(&x_hist[r][mseen[r]][0], (size_t)q_len * MHID);
      memcpy(hidden + (size_t)t * MHID, x_hist[r][mseen[r]], sizeof(float) * q_len * MHID);
      memcpy(rows + n * MMAXB, table + r * MMAXB, sizeof(int32_t) * MMAXB);
      mseen[r] += q_len;
      t += q_len;
      qsl[n + 1] = t;
      seq[n] = mseen[r];
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
    CHECK(aar_mla_builder_build(builder, &in, &md));
    aar_mla_metadata_info_t info;
    info.struct_size = sizeof(info);
    CHECK(aar_mla_metadata_get_info(md, &info));
    CHECK(aar_mla_impl_forward(layer, view2(&th, hidden, t, MHID), nc, rc, md, view2(&to, out, t, MHID)));
    double worst = 0.0, ref[MHID];
    int row = 0;
    for (int e = 0; e < n; ++e) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      for (int i = 0; i < q_len; ++i, ++row) {
        mla_reference(ref, r, mseen[r] - q_len + i);
        for (int d = 0; d < MHID; ++d) {
          const double diff = fabs(ref[d] - out[(size_t)row * MHID + d]);
          if (diff > worst) worst = diff;
        }
      }
    }
    printf("mla step %d: %d requests, %d tokens (%d decodes, %d prefills), max |out - ref| = %.2e\n", step, n, t,
           info.num_decodes, info.num_prefills, worst);
    ok = ok && worst < 1e-4;
  }
  aar_mla_impl_destroy(layer);
  aar_mla_builder_destroy(builder);
  return ok;
}

int main(void) {
  static float q[MAXTOK * H * D], k[MAXTOK * HKV * D], v[MAXTOK * HKV * D], out[MAXTOK * H * D];
  tensor_t tq, tk, tv, tkc, tvc, to;
  int ok = 1;
  if (aar_c_api_version() != AAR_C_API_VERSION) { /* a header of another release than the library */
    fprintf(stderr, "c_api.h is version %d, libascend_attn_rt_c %d\n", AAR_C_API_VERSION, aar_c_api_version());
    return 1;
  }

  aar_gqa_builder_config_t bc;
  aar_gqa_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = MAXTOK;
  bc.max_blocks_per_req = WIDTH;
  bc.block_size = BS;
  bc.num_blocks = NB;
  aar_gqa_builder_t* builder = NULL;
  CHECK(aar_gqa_builder_create(&bc, &builder));

  aar_gqa_impl_config_t ic;
  aar_gqa_impl_config_init(&ic);
  ic.num_heads = H;
  ic.num_kv_heads = HKV;
  ic.head_size = D;
  aar_gqa_impl_t* layer = NULL;
  CHECK(aar_gqa_impl_create(&ic, &layer));

  DLManagedTensor* kc = view(&tkc, &k_cache[0][0][0][0], 4, NB, BS, HKV, D);
  DLManagedTensor* vc = view(&tvc, &v_cache[0][0][0][0], 4, NB, BS, HKV, D);
  /* Request r owns blocks [r*WIDTH, r*WIDTH + WIDTH). */
  int32_t table[REQS * WIDTH];
  for (int i = 0; i < REQS * WIDTH; ++i) table[i] = i;

  /* Step 1: prefill prompts of 13 and 6 tokens. */
  int q_len[REQS] = {13, 6};
  int32_t qsl[REQS + 1], seq[REQS];
  aar_gqa_build_inputs_t in;
  aar_gqa_build_inputs_init(&in);
  in.block_table = table;
  in.block_table_len = REQS * WIDTH;
  in.block_table_stride = WIDTH;
  in.query_start_loc = qsl;
  in.query_start_loc_len = REQS + 1;
  in.seq_lens = seq;
  in.seq_lens_len = REQS;

  for (int step = 0; step < 3; ++step) {
    if (step > 0) q_len[0] = q_len[1] = 1; /* decodes */
    qsl[0] = 0;
    for (int r = 0; r < REQS; ++r) {
      qsl[r + 1] = qsl[r] + q_len[r];
      seq[r] = seen[r] + q_len[r];
    }
    const int T = qsl[REQS];
    fill(q, (size_t)T * H * D);
    fill(k, (size_t)T * HKV * D);
    fill(v, (size_t)T * HKV * D);
    const aar_gqa_metadata_t* md = NULL;
    CHECK(aar_gqa_builder_build(builder, &in, &md));
    aar_gqa_metadata_info_t info;
    info.struct_size = sizeof(info);
    CHECK(aar_gqa_metadata_get_info(md, &info));
    CHECK(aar_gqa_impl_forward(layer, view(&tq, q, 3, T, H, D, 0), view(&tk, k, 3, T, HKV, D, 0),
                               view(&tv, v, 3, T, HKV, D, 0), kc, vc, md, view(&to, out, 3, T, H, D, 0)));
    remember(k, v, q_len);
    const double diff = check(q, out, q_len);
    printf("eager step %d: %d tokens, %d decodes, %d prefills, path %s, max |out - ref| = %.2e\n", step, T,
           info.num_decodes, info.num_prefills, aar_gqa_impl_last_path(layer), diff);
    ok = ok && diff < 1e-5 && info.num_kernel_tokens == T;
  }

  /* Graph mode: capture a 2-token decode bucket once over static buffers, then
   * per step: build, write the step's inputs into the buffers, update, replay. */
  aar_graph_params_t* graph = NULL;
  CHECK(aar_graph_params_create("recording", NULL, 0, &graph));
  enum { BUCKET = 2 };
  for (int r = 0; r < REQS; ++r) seq[r] = seen[r] + 1;
  qsl[0] = 0, qsl[1] = 1, qsl[2] = 2;
  const aar_gqa_metadata_t* md = NULL;
  CHECK(aar_gqa_builder_build_for_graph_capture(builder, &in, AAR_STATE_DECODE_ONLY, &md));
  CHECK(aar_graph_begin_capture(graph, BUCKET));
  CHECK(aar_gqa_impl_forward(layer, view(&tq, q, 3, BUCKET, H, D, 0), view(&tk, k, 3, BUCKET, HKV, D, 0),
                             view(&tv, v, 3, BUCKET, HKV, D, 0), kc, vc, md, view(&to, out, 3, BUCKET, H, D, 0)));
  CHECK(aar_graph_end_capture(graph));
  int32_t captured = 0;
  CHECK(aar_graph_has(graph, BUCKET, &captured));
  ok = ok && captured == 1;
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < REQS; ++r) seq[r] = seen[r] + 1;
    CHECK(aar_gqa_builder_build(builder, &in, &md));
    fill(q, BUCKET * H * D);
    fill(k, BUCKET * HKV * D);
    fill(v, BUCKET * HKV * D);
    memset(out, 0, sizeof(float) * BUCKET * H * D);
    CHECK(aar_graph_update_gqa(graph, BUCKET, &md, 1));
    CHECK(aar_graph_replay(graph, BUCKET));
    remember(k, v, q_len);
    const double diff = check(q, out, q_len);
    printf("graph step %d: bucket %d, seq_lens (%d, %d), max |out - ref| = %.2e\n", step, BUCKET, seq[0], seq[1],
           diff);
    ok = ok && diff < 1e-5;
  }

  /* Bad input: a status and a message naming the argument; nothing written. */
  const float cache_before = k_cache[0][0][0][0];
  ok = ok && expect_rejected(aar_gqa_impl_forward(layer, NULL, NULL, NULL, kc, vc, md, &to.m), "query is NULL",
                             "query NULL");
  ok = ok && expect_rejected(aar_gqa_impl_forward(layer, view(&tq, q, 3, BUCKET, H + 1, D, 0), &tk.m, &tv.m, kc, vc,
                                                  md, &to.m),
                             "query", "query of 5 heads");
  seq[1] = 0;
  ok = ok && expect_rejected(aar_gqa_builder_build(builder, &in, &md), "seq_lens", "seq_lens below query lengths");
  aar_gqa_build_inputs_t uninit;
  memset(&uninit, 0, sizeof(uninit));
  ok = ok && expect_rejected(aar_gqa_builder_build(builder, &uninit, &md), "struct_size", "uninitialised inputs");
  ok = ok && expect_rejected(aar_graph_params_create("cuda", NULL, 0, &graph), "provider", "graph provider");
  /* Handles are typed: a cast does not make a layer a metadata. */
  ok = ok && expect_rejected(aar_gqa_impl_forward(layer, view(&tq, q, 3, BUCKET, H, D, 0), &tk.m, &tv.m, kc, vc,
                                                  (const aar_gqa_metadata_t*)layer, &to.m),
                             "metadata is an aar_gqa_impl_t", "impl given as metadata");
  ok = ok && k_cache[0][0][0][0] == cache_before && graph != NULL;

  aar_graph_params_destroy(graph);
  aar_gqa_impl_destroy(layer);
  aar_gqa_builder_destroy(builder);
  ok = run_mla() && ok;
  printf("%s\n", ok ? "c_attention: OK" : "c_attention: FAILED");
  return ok ? 0 : 1;
}
