/* DSA (DeepSeek-V4) decode context parallelism through the C ABI (version 7): two processes (this
 * program forks them, c_cp_harness.h) join a gloo group over a TCP rendezvous on 127.0.0.1, then
 * run a sliding-window (compress ratio 1) DSA layer at DCP 2 (interleave 2): each rank's step
 * builder is made by aar_dsa_step_builder_create_cp, its SWA group's builds take the table of the
 * rank's local blocks (the SWA cache is sharded: token x on rank (x / I) % W), and the layer
 * (aar_dsa_impl_create_cp) gathers the query heads, attends the window rows it holds without the
 * sinks, merges the partial results over the group and applies the sinks once. The steps: a
 * prefill longer than the window, a decode, a second request joining with a prefill, decodes of
 * both, a chunked prefill over cached context beside a decode, decodes. Every output row of every
 * rank is checked against the layer computed in float64 here (as c_dsa.c: q-LoRA with RMSNorm,
 * per-head RMSNorm of q, RMSNorm of the KV row, interleaved RoPE of the last R dims, attention over
 * the window [p - W + 1, p] with a per-head sink, inverse RoPE, the grouped o_proj; weights and
 * tokens the same on both ranks, drawn from one seed), and each rank's SWA cache holds exactly the
 * tokens it owns. A few bad calls are rejected by name.
 *
 *   c_dsa_cp                       forks ranks 0 and 1, waits at most 120 s
 *   c_dsa_cp <rank> <port>         one rank, for running the two by hand */
#define _POSIX_C_SOURCE 200809L
#include "c_cp_harness.h"

enum { HID = 32, N = 2, D = 32, R = 8, Q = 16, W = 8, G = 2, OL = 8, REQS = 2, TOK = 24, STEPS = 6, MAXPOS = 64 };
enum { MAXB = 4, NB = 9, DCP = 2, INTERLEAVE = 2, BS = 32 };
enum { DEADLINE_S = 120, COMM_TIMEOUT_MS = 20000 };
#define EPS 1e-6

static float wq_a[Q][HID], q_norm[Q], wq_b[N * D][Q], wkv[D][HID], kv_norm[D], sink[N], wo_a[G][N * D / G][OL],
    wo_b[HID][G * OL];
static float cos_t[MAXPOS][R], sin_t[MAXPOS][R];
static float x_hist[REQS][TOK][HID]; /* hidden states each request has seen (global) */

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


static int run_rank(int rank, aar_cp_comm_t* comm) {
  static float hidden[TOK * HID], out[TOK * HID], *swa = NULL;
  tensor_t tw[8], tcos, tsin, tswa, th, to;
  int ok = 1;
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
  aar_dsa_step_builder_cp_t cp;
  aar_dsa_step_builder_cp_init(&cp);
  cp.dcp_world_size = DCP;
  cp.dcp_rank = rank;
  cp.interleave = INTERLEAVE;
  aar_dsa_step_builder_t* step_builder = NULL;
  {
    aar_dsa_step_builder_cp_t bad = cp;
    bad.dcp_rank = DCP;
    ok &= expect_rejected(aar_dsa_step_builder_create_cp(&sc, &bad, &step_builder), "cp->dcp_rank=2 is out of range",
                          "dcp_rank 2 of 2");
  }
  CHECK(aar_dsa_step_builder_create_cp(&sc, &cp, &step_builder));
  aar_dsa_group_config_t gc;
  aar_dsa_group_config_init(&gc);
  gc.kind = AAR_DSA_SWA;
  gc.cache_block_size = BS;
  gc.max_blocks_per_req = MAXB;
  gc.num_blocks = NB;
  aar_dsa_group_builder_t* swa_builder = NULL;
  CHECK(aar_dsa_group_builder_create(step_builder, &gc, &swa_builder));
  aar_dsa_group_cache_info_t info;
  info.struct_size = sizeof(info);
  CHECK(aar_dsa_group_builder_cache_info(swa_builder, NB, &info));
  ok = ok && info.kv_ndim == 4 && info.kv_shape[0] == NB && info.kv_shape[1] == BS && info.kv_shape[3] == D;
  const size_t cache_elems = (size_t)NB * BS * (size_t)info.kv_shape[2] * D;
  swa = calloc(cache_elems, sizeof(float)); /* this rank's shard; the model is float32: so is its cache */
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
  ok &= expect_rejected(aar_dsa_impl_create_cp(&ic, &w, NULL, &layer), "dcp_comm is NULL", "no communicator");
  CHECK(aar_dsa_impl_create_cp(&ic, &w, comm, &layer));

  /* One SWA block table for every rank (block ids of each rank's own shard). */
  const int32_t table[REQS * MAXB] = {3, 7, 1, 0, /**/ 5, 2, 6, 8};
  /* (request, new tokens) per step, decodes first. */
  const int steps[STEPS][2][2] = {{{0, 11}, {-1, 0}}, {{0, 1}, {-1, 0}}, {{0, 1}, {1, 10}},
                                  {{0, 1}, {1, 1}},   {{0, 1}, {1, 5}},  {{0, 1}, {1, 1}}};
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
    for (int i = 0; i < t * HID; ++i) out[i] = NAN;
    CHECK(aar_dsa_impl_forward(layer, view2(&th, hidden, t, HID), kv, 6, st, &gm, 1, view2(&to, out, t, HID), NULL));
    double worst = 0.0, ref[HID];
    int row = 0;
    for (int e = 0; e < n; ++e) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      for (int i = 0; i < q_len; ++i, ++row) {
        dsa_reference(ref, (const float(*)[HID])x_hist[r], seen[r] - q_len + i);
        for (int d = 0; d < HID; ++d) {
          const double diff = fabs(ref[d] - out[(size_t)row * HID + d]);
          if (!(diff <= worst)) worst = diff;
        }
      }
    }
    printf("rank %d dsa dcp step %d: %d requests, %d tokens (%d decodes, %d prefills), max |out - ref| = %.2e\n",
           rank, step, n, t, si.num_decodes, si.num_prefills, worst);
    ok = ok && worst < 1e-4;
  }
  { /* The SWA cache is sharded: this rank's holds exactly the tokens it owns (token x of a request:
     * owner (x / I) % W, local index (x / (W I)) I + x % I through the request's local blocks). */
    const size_t row_elems = (size_t)info.kv_shape[2] * D;
    int rows_ok = 1, owned = 0, written = 0, total = 0;
    for (size_t s = 0; s < (size_t)NB * BS; ++s) {
      int nz = 0;
      for (size_t i = 0; i < row_elems; ++i) nz |= swa[s * row_elems + i] != 0.0f;
      written += nz;
    }
    for (int r = 0; r < REQS; ++r) {
      for (int x = 0; x < seen[r]; ++x, ++total) {
        if ((x / INTERLEAVE) % DCP != rank) continue;
        const int local = (x / (DCP * INTERLEAVE)) * INTERLEAVE + x % INTERLEAVE;
        const size_t s = (size_t)table[r * MAXB + local / BS] * BS + local % BS;
        int nz = 0;
        for (size_t i = 0; i < row_elems; ++i) nz |= swa[s * row_elems + i] != 0.0f;
        rows_ok &= nz;
        ++owned;
      }
    }
    printf("rank %d dsa dcp: %d swa cache rows written, %d tokens owned (of %d)%s\n", rank, written, owned, total,
           rows_ok && written == owned ? "" : "  (UNEXPECTED)");
    ok = ok && rows_ok && written == owned;
  }
  { /* Metadata of a single-rank step builder on this 2-rank layer: refused before any collective,
     * nothing written. */
    float* before = malloc(cache_elems * sizeof(float));
    memcpy(before, swa, cache_elems * sizeof(float));
    aar_dsa_step_builder_t* single = NULL;
    aar_dsa_group_builder_t* single_swa = NULL;
    CHECK(aar_dsa_step_builder_create(&sc, &single));
    CHECK(aar_dsa_group_builder_create(single, &gc, &single_swa));
    const int32_t qsl[2] = {0, 1}, seq[1] = {1};
    aar_dsa_step_inputs_t in;
    aar_dsa_step_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = 2;
    in.seq_lens = seq;
    in.seq_lens_len = 1;
    CHECK(aar_dsa_step_builder_build(single, &in, &st));
    CHECK(aar_dsa_group_builder_build(single_swa, st, table, MAXB, MAXB, &gm));
    ok &= expect_rejected(aar_dsa_impl_forward(layer, view2(&th, hidden, 1, HID), kv, 6, st, &gm, 1,
                                               view2(&to, out, 1, HID), NULL),
                          "dcp_comm", "single-rank metadata");
    ok = ok && memcmp(before, swa, cache_elems * sizeof(float)) == 0;
    free(before);
    aar_dsa_group_builder_destroy(single_swa);
    aar_dsa_step_builder_destroy(single);
  }
  aar_dsa_impl_destroy(layer);
  aar_dsa_group_builder_destroy(swa_builder); /* before its step builder */
  aar_dsa_step_builder_destroy(step_builder);
  free(swa);
  return ok;
}

int main(int argc, char** argv) {
  return cp_main(argc, argv, DCP, DEADLINE_S, COMM_TIMEOUT_MS, run_rank, "OK: both ranks match the float64 reference");
}
