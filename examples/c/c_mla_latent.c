/* A C11 engine that does the MLA projections itself and calls the runtime only for
 * the attention, through the C ABI's LatentAttention (ascend_attn_rt/c_api.h): per
 * step it writes the new tokens' latent rows (kv_c, k_pe) into the paged caches at
 * its own slot mapping, runs the decode tokens with W_UK absorbed into the query
 * (and applies W_UV to the latent output), and the prefill tokens un-absorbed with
 * kv_b_proj. Two requests: a prefill, decodes, the second request joining late.
 * Every output row is checked against float64 attention over the request's
 * up-projected keys and values computed here. Then a few bad calls, each rejected
 * by name with nothing written.
 *
 * Build: examples/c/CMakeLists.txt; ctest `example_c_mla_latent` runs it. */
#include "c_example.h"

enum { H = 2, L = 16, P = 8, R = 8, V = 8, BS = 16, NB = 8, MAXB = 4, REQS = 2, TOK = 24, STEPS = 4 };

static float kv_b[H * (P + V)][L];
static float c_hist[REQS][TOK][L], pe_hist[REQS][TOK][R], q_hist[REQS][TOK][H][P + R];
static float nope_cache[NB][BS][1][L], rope_cache[NB][BS][1][R];

/* o (H*V): the attention of request r's query at position p over its positions [0, p]. */
static void reference(double* o, int r, int p) {
  const double scale = 1.0 / sqrt((double)(P + R));
  for (int h = 0; h < H; ++h) {
    double logit[TOK], mx = -INFINITY, sum = 0.0, k[P], v[TOK][V];
    for (int j = 0; j <= p; ++j) {
      matvec(k, &kv_b[h * (P + V)][0], c_hist[r][j], NULL, P, L);
      matvec(v[j], &kv_b[h * (P + V) + P][0], c_hist[r][j], NULL, V, L);
      double s = 0.0;
      for (int i = 0; i < P; ++i) s += (double)q_hist[r][p][h][i] * k[i];
      for (int i = 0; i < R; ++i) s += (double)q_hist[r][p][h][P + i] * pe_hist[r][j][i];
      logit[j] = s * scale;
      if (logit[j] > mx) mx = logit[j];
    }
    for (int j = 0; j <= p; ++j) sum += (logit[j] = exp(logit[j] - mx));
    for (int i = 0; i < V; ++i) {
      o[h * V + i] = 0.0;
      for (int j = 0; j <= p; ++j) o[h * V + i] += logit[j] / sum * v[j][i];
    }
  }
}

int main(void) {
  static float cos_t[MAXB * BS][R], sin_t[MAXB * BS][R]; /* the builder needs tables; LatentAttention reads none */
  static float kv_c[TOK][L], k_pe[TOK][R], q[TOK][H][P + R], ql_nope[TOK][H][L], q_pe[TOK][H][R], lat[TOK][H][L],
      out[TOK][H * V];
  static int64_t slots[TOK];
  tensor_t tcos, tsin, tn, tr, tw, tc, tp, ts, tq, tql, tqp, tlat, to;
  int ok = 1;
  if (aar_c_api_version() != AAR_C_API_VERSION) {
    fprintf(stderr, "c_api.h is version %d, libascend_attn_rt_c %d\n", AAR_C_API_VERSION, aar_c_api_version());
    return 1;
  }
  fill(&kv_b[0][0], sizeof(kv_b) / sizeof(float));

  aar_mla_builder_config_t bc;
  aar_mla_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = TOK;
  bc.max_blocks_per_req = MAXB;
  bc.block_size = BS;
  bc.num_blocks = NB;
  bc.cos_table = view2(&tcos, &cos_t[0][0], MAXB * BS, R);
  bc.sin_table = view2(&tsin, &sin_t[0][0], MAXB * BS, R);
  aar_mla_builder_t* builder = NULL;
  CHECK(aar_mla_builder_create(&bc, &builder));
  aar_mla_latent_config_t lc;
  aar_mla_latent_config_init(&lc);
  lc.num_heads = H;
  lc.kv_lora_rank = L;
  lc.qk_nope_head_dim = P;
  lc.qk_rope_head_dim = R;
  lc.v_head_dim = V;
  aar_mla_latent_t* attn = NULL;
  CHECK(aar_mla_latent_create(&lc, &attn));
  const DLManagedTensor* nc = view(&tn, &nope_cache[0][0][0][0], 4, NB, BS, 1, L);
  const DLManagedTensor* rc = view(&tr, &rope_cache[0][0][0][0], 4, NB, BS, 1, R);
  const DLManagedTensor* w = view2(&tw, &kv_b[0][0], H * (P + V), L);

  const int32_t table[REQS * MAXB] = {3, 7, 1, 0, /**/ 5, 2, 6, 4};
  const int steps[STEPS][2][2] = {{{0, 5}, {-1, 0}}, {{0, 1}, {-1, 0}}, {{0, 1}, {1, 9}}, {{0, 1}, {1, 1}}};
  int seen[REQS] = {0, 0};
  const aar_mla_metadata_t* md = NULL;
  for (int step = 0; step < STEPS; ++step) {
    int32_t qsl[REQS + 1] = {0}, seq[REQS], rows[REQS * MAXB];
    int n = 0, t = 0;
    for (int e = 0; e < 2 && steps[step][e][0] >= 0; ++e, ++n) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      for (int i = 0; i < q_len; ++i, ++t) {
        const int pos = seen[r] + i;
        fill(c_hist[r][pos], L);
        fill(pe_hist[r][pos], R);
        fill(&q_hist[r][pos][0][0], H * (P + R));
        memcpy(kv_c[t], c_hist[r][pos], sizeof(kv_c[t]));
        memcpy(k_pe[t], pe_hist[r][pos], sizeof(k_pe[t]));
        memcpy(q[t], q_hist[r][pos], sizeof(q[t]));
        slots[t] = (int64_t)table[r * MAXB + pos / BS] * BS + pos % BS; /* the engine's slot mapping */
      }
      memcpy(rows + n * MAXB, table + r * MAXB, sizeof(int32_t) * MAXB);
      seen[r] += q_len;
      qsl[n + 1] = t;
      seq[n] = seen[r];
    }
    aar_mla_build_inputs_t in;
    aar_mla_build_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = n + 1;
    in.seq_lens = seq;
    in.seq_lens_len = n;
    in.block_table = rows;
    in.block_table_len = n * MAXB;
    in.block_table_stride = MAXB;
    CHECK(aar_mla_builder_build(builder, &in, &md));
    aar_mla_metadata_info_t info;
    info.struct_size = sizeof(info);
    CHECK(aar_mla_metadata_get_info(md, &info));
    CHECK(aar_mla_latent_write_kv(attn, view2(&tc, &kv_c[0][0], t, L), view2(&tp, &k_pe[0][0], t, R),
                                  view_typed(&ts, slots, kDLInt, 64, 1, t, 0, 0, 0), nc, rc));
    const int nd = info.num_decode_tokens, np = info.num_prefill_tokens;
    if (nd > 0) { /* absorb W_UK: ql_nope[h] = q_nope[h] W_UK_T[h], W_UK_T[h][p][l] = kv_b[h(P+V) + p][l] */
      for (int i = 0; i < nd; ++i) {
        for (int h = 0; h < H; ++h) {
          for (int l = 0; l < L; ++l) {
            double acc = 0.0;
            for (int p = 0; p < P; ++p) acc += (double)q[i][h][p] * kv_b[h * (P + V) + p][l];
            ql_nope[i][h][l] = (float)acc;
          }
          memcpy(q_pe[i][h], &q[i][h][P], sizeof(float) * R);
        }
      }
      CHECK(aar_mla_latent_forward_decode(attn, view(&tql, &ql_nope[0][0][0], 3, nd, H, L, 0),
                                          view(&tqp, &q_pe[0][0][0], 3, nd, H, R, 0), nc, rc, md,
                                          view(&tlat, &lat[0][0][0], 3, nd, H, L, 0)));
      for (int i = 0; i < nd; ++i) { /* apply W_UV */
        for (int h = 0; h < H; ++h) {
          for (int v = 0; v < V; ++v) {
            double acc = 0.0;
            for (int l = 0; l < L; ++l) acc += (double)lat[i][h][l] * kv_b[h * (P + V) + P + v][l];
            out[i][h * V + v] = (float)acc;
          }
        }
      }
    }
    if (np > 0) {
      CHECK(aar_mla_latent_forward_prefill(attn, view(&tq, &q[nd][0][0], 3, np, H, P + R, 0),
                                           view2(&tc, &kv_c[nd][0], np, L), view2(&tp, &k_pe[nd][0], np, R), nc, rc,
                                           md, view2(&to, &out[nd][0], np, H * V), w));
    }
    double worst = 0.0, ref[H * V];
    int row = 0;
    for (int e = 0; e < n; ++e) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      for (int i = 0; i < q_len; ++i, ++row) {
        reference(ref, r, seen[r] - q_len + i);
        for (int d = 0; d < H * V; ++d) {
          const double diff = fabs(ref[d] - out[row][d]);
          if (diff > worst) worst = diff;
        }
      }
    }
    printf("latent step %d: %d requests, %d decode + %d prefill tokens, max |out - ref| = %.2e\n", step, n, nd, np,
           worst);
    ok = ok && worst < 1e-4;
  }

  /* Bad input: a status and a message naming the argument; nothing written. */
  static float nope_before[NB][BS][1][L];
  memcpy(nope_before, nope_cache, sizeof(nope_before));
  slots[1] = NB * BS; /* past the cache: nothing at all is written */
  ok = ok && expect_rejected(aar_mla_latent_write_kv(attn, view2(&tc, &kv_c[0][0], 2, L), view2(&tp, &k_pe[0][0], 2, R),
                                                     view_typed(&ts, slots, kDLInt, 64, 1, 2, 0, 0, 0), nc, rc),
                             "slot", "slot past the cache");
  ok = ok && expect_rejected(aar_mla_latent_write_kv(attn, view2(&tc, &kv_c[0][0], 2, L), NULL, &ts.m, nc, rc),
                             "k_pe is NULL", "k_pe NULL");
  ok = ok && expect_rejected(aar_mla_latent_forward_decode((aar_mla_latent_t*)builder, &tql.m, &tqp.m, nc, rc, md,
                                                           &tlat.m),
                             "latent is an aar_mla_builder_t", "builder given as latent");
  ok = ok && memcmp(nope_before, nope_cache, sizeof(nope_before)) == 0;

  aar_mla_latent_destroy(attn);
  aar_mla_builder_destroy(builder);
  printf("%s\n", ok ? "c_mla_latent: OK" : "c_mla_latent: FAILED");
  return ok ? 0 : 1;
}
