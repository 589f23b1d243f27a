/* A C11 engine running a DSA (DeepSeek-V4) sliding-window layer through the C ABI
 * (ascend_attn_rt/c_api.h): a step builder, the SWA cache group's builder (the
 * cache allocated from the group's cache facts) and a compress-ratio-1 layer. Two
 * requests: a prefill longer than the window, decodes, the second request joining
 * late. Every output row is checked against the layer computed in float64 here
 * (docs/design/dsa.md §1.1, §1.4, §5.2): q-LoRA with RMSNorm, per-head RMSNorm of
 * q, RMSNorm of the shared KV row, interleaved RoPE of the last R dims, attention
 * over the window [p - W + 1, p] with a per-head sink in the denominator, inverse
 * RoPE of the output, the grouped o_proj. Then a few bad calls, each rejected by
 * name with nothing written.
 *
 * Build: examples/c/CMakeLists.txt; ctest `example_c_dsa` runs it. */
#include "c_example.h"

enum { HID = 32, N = 2, D = 32, R = 8, Q = 16, W = 8, G = 2, OL = 8, REQS = 2, TOK = 24, STEPS = 4, MAXPOS = 64 };
enum { MAXB = 4, NB = 9 };
#define EPS 1e-6

static float wq_a[Q][HID], q_norm[Q], wq_b[N * D][Q], wkv[D][HID], kv_norm[D], sink[N], wo_a[G][N * D / G][OL],
    wo_b[HID][G * OL];
static float cos_t[MAXPOS][R], sin_t[MAXPOS][R];
static float x_hist[REQS][TOK][HID];

static void rms(double* x, int n, const float* g) {
  double ms = 0.0;
  for (int i = 0; i < n; ++i) ms += x[i] * x[i] / n;
  for (int i = 0; i < n; ++i) x[i] = x[i] / sqrt(ms + EPS) * (g ? g[i] : 1.0);
}

/* Interleaved RoPE of the last R dims of x (D) at position p; sign -1: the inverse. */
static void rope_last(double* x, int p, double sign) {
  double* y = x + D - R;
  for (int i = 0; i < R; i += 2) {
    const double c = cos_t[p][i], s = sign * sin_t[p][i], a = y[i], b = y[i + 1];
    y[i] = a * c - b * s;
    y[i + 1] = b * c + a * s;
  }
}

/* out (HID): the layer's output for the token at position p of a request whose tokens so far are x. */
static void dsa_reference(double* out, const float (*x)[HID], int p) {
  double qr[Q], q[N * D], kv[TOK][D], o[N * D], t[G * OL];
  matvec(qr, &wq_a[0][0], x[p], NULL, Q, HID);
  rms(qr, Q, q_norm);
  matvec(q, &wq_b[0][0], NULL, qr, N * D, Q);
  for (int h = 0; h < N; ++h) rms(q + h * D, D, NULL), rope_last(q + h * D, p, 1.0);
  const int first = p - W + 1 > 0 ? p - W + 1 : 0;
  for (int j = first; j <= p; ++j) {
    matvec(kv[j], &wkv[0][0], x[j], NULL, D, HID);
    rms(kv[j], D, kv_norm);
    rope_last(kv[j], j, 1.0);
  }
  for (int h = 0; h < N; ++h) {
    double logit[TOK], m = sink[h], denom = 0.0;
    for (int j = first; j <= p; ++j) {
      logit[j] = 0.0;
      for (int d = 0; d < D; ++d) logit[j] += q[h * D + d] * kv[j][d];
      logit[j] /= sqrt((double)D);
      if (logit[j] > m) m = logit[j];
    }
    for (int d = 0; d < D; ++d) o[h * D + d] = 0.0;
    for (int j = first; j <= p; ++j) {
      const double e = exp(logit[j] - m);
      denom += e;
      for (int d = 0; d < D; ++d) o[h * D + d] += e * kv[j][d];
    }
    denom += exp(sink[h] - m);
    for (int d = 0; d < D; ++d) o[h * D + d] /= denom;
    rope_last(o + h * D, p, -1.0);
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < OL; ++c) {
      double acc = 0.0;
      for (int i = 0; i < N * D / G; ++i) acc += o[g * (N * D / G) + i] * wo_a[g][i][c];
      t[g * OL + c] = acc;
    }
  }
  matvec(out, &wo_b[0][0], NULL, t, HID, G * OL);
}

int main(void) {
  static float hidden[TOK * HID], out[TOK * HID], *swa = NULL;
  tensor_t tw[8], tcos, tsin, tswa, th, to;
  int ok = 1;
  if (aar_c_api_version() != AAR_C_API_VERSION) {
    fprintf(stderr, "c_api.h is version %d, libascend_attn_rt_c %d\n", AAR_C_API_VERSION, aar_c_api_version());
    return 1;
  }
  fill(&wq_a[0][0], sizeof(wq_a) / sizeof(float));
  fill(&wq_b[0][0], sizeof(wq_b) / sizeof(float));
  fill(&wkv[0][0], sizeof(wkv) / sizeof(float));
  fill(&wo_a[0][0][0], sizeof(wo_a) / sizeof(float));
  fill(&wo_b[0][0], sizeof(wo_b) / sizeof(float));
  fill(sink, N);
  for (int i = 0; i < Q; ++i) q_norm[i] = 1.0f + 0.1f * uniform();
  for (int i = 0; i < D; ++i) kv_norm[i] = 1.0f + 0.1f * uniform();
  /* Tables (max_position, R), repeat-interleaved: columns 2i and 2i+1 hold angle p * 10000^(-2i/R). */
  for (int p = 0; p < MAXPOS; ++p) {
    for (int i = 0; i < R; ++i) {
      const double a = p * pow(10000.0, -(double)(i / 2 * 2) / R);
      cos_t[p][i] = (float)cos(a), sin_t[p][i] = (float)sin(a);
    }
  }

  aar_dsa_step_builder_config_t sc;
  aar_dsa_step_builder_config_init(&sc);
  sc.max_num_reqs = 4;
  sc.max_num_tokens = TOK;
  sc.cos_table = view2(&tcos, &cos_t[0][0], MAXPOS, R);
  sc.sin_table = view2(&tsin, &sin_t[0][0], MAXPOS, R);
  sc.head_dim = D;
  sc.window = W;
  sc.num_heads_q = N;
  aar_dsa_step_builder_t* step_builder = NULL;
  CHECK(aar_dsa_step_builder_create(&sc, &step_builder));
  aar_dsa_group_config_t gc;
  aar_dsa_group_config_init(&gc);
  gc.kind = AAR_DSA_SWA;
  gc.cache_block_size = 32;
  gc.max_blocks_per_req = MAXB;
  gc.num_blocks = NB;
  aar_dsa_group_builder_t* swa_builder = NULL;
  CHECK(aar_dsa_group_builder_create(step_builder, &gc, &swa_builder));
  aar_dsa_group_cache_info_t info;
  info.struct_size = sizeof(info);
  CHECK(aar_dsa_group_builder_cache_info(swa_builder, NB, &info));
  size_t cache_elems = 1;
  for (int i = 0; i < info.kv_ndim; ++i) cache_elems *= (size_t)info.kv_shape[i];
  printf("swa group: block size %lld, cache (%lld, %lld, %lld, %lld)\n", (long long)info.block_size,
         (long long)info.kv_shape[0], (long long)info.kv_shape[1], (long long)info.kv_shape[2],
         (long long)info.kv_shape[3]);
  ok = ok && info.kv_ndim == 4 && info.kv_shape[3] == D && info.block_size * MAXB >= TOK;
  swa = calloc(cache_elems, sizeof(float)); /* the model is float32: so is its cache */
  const DLManagedTensor* swa_t =
      view(&tswa, swa, 4, info.kv_shape[0], info.kv_shape[1], info.kv_shape[2], info.kv_shape[3]);
  /* The ratio-1 tuple: (compress_kv, swa_kv, state, indexer_state, indexer_k, indexer_scale). */
  const DLManagedTensor* kv[6] = {NULL, swa_t, NULL, NULL, NULL, NULL};

  aar_dsa_impl_config_t ic;
  aar_dsa_impl_config_init(&ic);
  ic.hidden_size = HID;
  ic.num_heads = N;
  ic.head_dim = D;
  ic.rope_dim = R;
  ic.q_lora_rank = Q;
  ic.compress_ratio = 1;
  ic.o_groups = G;
  ic.o_lora_rank = OL;
  aar_dsa_weights_t w;
  aar_dsa_weights_init(&w);
  w.wq_a = view2(&tw[0], &wq_a[0][0], Q, HID);
  w.q_norm = view(&tw[1], q_norm, 1, Q, 0, 0, 0);
  w.wq_b = view2(&tw[2], &wq_b[0][0], N * D, Q);
  w.wkv = view2(&tw[3], &wkv[0][0], D, HID);
  w.kv_norm = view(&tw[4], kv_norm, 1, D, 0, 0, 0);
  w.attn_sink = view(&tw[5], sink, 1, N, 0, 0, 0);
  w.wo_a = view(&tw[6], &wo_a[0][0][0], 3, G, N * D / G, OL, 0);
  w.wo_b = view2(&tw[7], &wo_b[0][0], HID, G * OL);
  aar_dsa_impl_t* layer = NULL;
  CHECK(aar_dsa_impl_create(&ic, &w, &layer));

  const int32_t table[REQS * MAXB] = {3, 7, 1, 0, /**/ 5, 2, 6, 8};
  /* (request, new tokens) per step, decodes first. */
  const int steps[STEPS][2][2] = {{{0, 11}, {-1, 0}}, {{0, 1}, {-1, 0}}, {{0, 1}, {1, 10}}, {{0, 1}, {1, 1}}};
  int seen[REQS] = {0, 0};
  const aar_dsa_step_metadata_t* st = NULL;
  const aar_dsa_group_metadata_t* gm = NULL;
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
    aar_dsa_step_inputs_t in;
    aar_dsa_step_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = n + 1;
    in.seq_lens = seq;
    in.seq_lens_len = n;
    CHECK(aar_dsa_step_builder_build(step_builder, &in, &st));
    CHECK(aar_dsa_group_builder_build(swa_builder, st, rows, n * MAXB, MAXB, &gm));
    aar_dsa_step_metadata_info_t si;
    si.struct_size = sizeof(si);
    CHECK(aar_dsa_step_metadata_get_info(st, &si));
    CHECK(aar_dsa_impl_forward(layer, view2(&th, hidden, t, HID), kv, 6, st, &gm, 1, view2(&to, out, t, HID), NULL));
    double worst = 0.0, ref[HID];
    int row = 0;
    for (int e = 0; e < n; ++e) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      for (int i = 0; i < q_len; ++i, ++row) {
        dsa_reference(ref, (const float(*)[HID])x_hist[r], seen[r] - q_len + i);
        for (int d = 0; d < HID; ++d) {
          const double diff = fabs(ref[d] - out[(size_t)row * HID + d]);
          if (diff > worst) worst = diff;
        }
      }
    }
    printf("dsa step %d: %d requests, %d tokens (%d decodes, %d prefills), max |out - ref| = %.2e\n", step, n, t,
           si.num_decodes, si.num_prefills, worst);
    ok = ok && worst < 1e-4;
  }

  /* Bad input: a status and a message naming the argument; nothing written. */
  float* before = malloc(cache_elems * sizeof(float));
  memcpy(before, swa, cache_elems * sizeof(float));
  DLManagedTensor* h2 = view2(&th, hidden, 2, HID);
  DLManagedTensor* o2 = view2(&to, out, 2, HID);
  ok = ok && expect_rejected(aar_dsa_impl_forward(layer, h2, kv, 6, st, NULL, 0, o2, NULL),
                             "no group of cache kind", "step without its groups");
  ok = ok && expect_rejected(aar_dsa_impl_forward(layer, h2, kv, 5, st, &gm, 1, o2, NULL), "num_kv_cache",
                             "tuple of 5");
  ok = ok && expect_rejected(aar_dsa_impl_forward(layer, h2, kv, 6, (const aar_dsa_step_metadata_t*)gm, &gm, 1, o2,
                                                  NULL),
                             "step is an aar_dsa_group_metadata_t", "group given as step");
  gc.kind = (aar_dsa_cache_kind_t)9;
  aar_dsa_group_builder_t* bad = NULL;
  ok = ok && expect_rejected(aar_dsa_group_builder_create(step_builder, &gc, &bad), "config->kind", "cache kind 9");
  ok = ok && bad == NULL && memcmp(before, swa, cache_elems * sizeof(float)) == 0;
  free(before);

  aar_dsa_impl_destroy(layer);
  aar_dsa_group_builder_destroy(swa_builder); /* before its step builder */
  aar_dsa_step_builder_destroy(step_builder);
  free(swa);
  printf("%s\n", ok ? "c_dsa: OK" : "c_dsa: FAILED");
  return ok ? 0 : 1;
}
