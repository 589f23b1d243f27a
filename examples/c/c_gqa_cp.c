/* GQA context parallelism through the C ABI: two processes (this program forks them) join a
 * gloo group over a TCP rendezvous on 127.0.0.1 (aar_cp_comm_create_tcp), then
 *   - DCP (decode context parallel): each rank holds half of the query heads and every other
 *     token's KV; a prefill of two requests, a decode step (the first collectives), a mixed
 *     step (a decode and a chunked prefill over cached context), then graph mode: a decode
 *     bucket captured once and replayed for two steps (the collectives inside the replay);
 *   - PCP (prefill context parallel), with the KV sharded over the ranks and replicated on
 *     each: every rank builds the global step and runs its local rows
 *     (aar_gqa_pcp_builder_local_rows); a prefill of two requests, a decode with a chunked
 *     prefill over cached context, a speculative decode step (a builder with
 *     num_speculative_tokens, aar_gqa_pcp_builder_create_ext), then graph mode: a decode
 *     bucket captured once and replayed for a speculative and a one-token decode step.
 * Every output row of every step is checked against a float64 attention over the request's
 * whole history, computed here with plain loops from the global inputs (which both ranks
 * generate alike from one seed). A few bad calls are rejected by name.
 *
 *   c_gqa_cp                       forks ranks 0 and 1, waits at most 120 s (c_cp_harness.h)
 *   c_gqa_cp <rank> <port>         one rank, for running the two by hand
 *
 * The communicator's timeout is 20 s. */
#define _POSIX_C_SOURCE 200809L
#include "c_cp_harness.h"

enum { W = 2, H = 4, HKV = 2, D = 16, BS = 16, NB = 8, MAXB = 4, REQS = 2, MAXTOK = 48 };
enum { DEADLINE_S = 120, COMM_TIMEOUT_MS = 20000 };

/* Every K/V row each request has seen (global, both ranks alike) and its length. */
static float k_hist[REQS][MAXTOK][HKV][D], v_hist[REQS][MAXTOK][HKV][D];
static int seen[REQS];
static float k_cache[NB][BS][HKV][D], v_cache[NB][BS][HKV][D];
static const int32_t table[REQS][MAXB] = {{1, 2, 3, 0}, {4, 5, 6, 7}}; /* local block ids, one table for all ranks */

/* One step of the global batch: requests in order (decodes first), new tokens each. */
typedef struct {
  int n;
  int req[REQS], q_len[REQS];
  const char* what;
} step_t;

/* The step's global inputs: q (T, H_total, D) with H_total query heads, k / v (T, HKV, D),
 * appended to the histories; the build inputs' arrays. */
typedef struct {
  int T;
  int32_t qsl[REQS + 1], seq[REQS], rows[REQS * MAXB];
  uint8_t pref[REQS];
} batch_t;

static void make_batch(const step_t* s, batch_t* b, float* q, int h_total, float* k, float* v) {
  b->T = 0;
  b->qsl[0] = 0;
  for (int i = 0; i < s->n; ++i) {
    const int r = s->req[i], n = s->q_len[i];
    fill(q + (size_t)b->T * h_total * D, (size_t)n * h_total * D);
    fill(k + (size_t)b->T * HKV * D, (size_t)n * HKV * D);
    fill(v + (size_t)b->T * HKV * D, (size_t)n * HKV * D);
    memcpy(k_hist[r][seen[r]], k + (size_t)b->T * HKV * D, sizeof(float) * n * HKV * D);
    memcpy(v_hist[r][seen[r]], v + (size_t)b->T * HKV * D, sizeof(float) * n * HKV * D);
    b->pref[i] = n > 1; /* a one-token step of a request with context is a decode */
    seen[r] += n;
    b->T += n;
    b->qsl[i + 1] = b->T;
    b->seq[i] = seen[r];
    memcpy(b->rows + i * MAXB, table[r], sizeof(table[r]));
  }
}

/* max |out - ref| of global token t's output row (H heads: query heads [h0, h0 + H) of the
 * step's q of h_total heads), attending its request's history up to its own position. */
static double row_diff(const step_t* s, const batch_t* b, const float* q, int h_total, int h0, int t,
                       const float* out_row) {
  int i = 0;
  while (t >= b->qsl[i + 1]) ++i;
  const int r = s->req[i];
  const int pos = b->seq[i] - s->q_len[i] + (t - b->qsl[i]);
  float qr[H * D];
  memcpy(qr, q + ((size_t)t * h_total + h0) * D, sizeof(qr));
  return gqa_row_diff(qr, &k_hist[r][0][0][0], &v_hist[r][0][0][0], pos + 1, H, HKV, D, out_row);
}

static void reset_model(void) {
  memset(seen, 0, sizeof(seen));
  memset(k_cache, 0, sizeof(k_cache));
  memset(v_cache, 0, sizeof(v_cache));
}

/* ------------------------------------------------------------------ DCP */

static aar_gqa_dcp_build_inputs_t dcp_inputs(const step_t* s, const batch_t* b, int num_input_tokens) {
  aar_gqa_dcp_build_inputs_t in;
  aar_gqa_dcp_build_inputs_init(&in);
  in.query_start_loc = b->qsl;
  in.query_start_loc_len = s->n + 1;
  in.seq_lens = b->seq;
  in.seq_lens_len = s->n;
  in.block_table = b->rows;
  in.block_table_len = s->n * MAXB;
  in.block_table_stride = MAXB;
  in.is_prefilling = b->pref;
  in.is_prefilling_len = s->n;
  in.num_input_tokens = num_input_tokens;
  return in;
}

/* Graph mode: a decode bucket captured once on static buffers, then decode steps of both
 * requests padded to it (build, update, replay: the collectives run inside the replay), each
 * checked against the float64 reference. */
static int run_dcp_graph(int rank, aar_cp_comm_t* comm, aar_gqa_dcp_builder_t* builder, aar_gqa_dcp_impl_t* layer,
                         DLManagedTensor* kc, DLManagedTensor* vc) {
  enum { BUCKET = 4 };
  static float q[MAXTOK * W * H * D], k[MAXTOK * HKV * D], v[MAXTOK * HKV * D];
  static float qs[BUCKET * H * D], ks[BUCKET * HKV * D], vs[BUCKET * HKV * D], outs[BUCKET * H * D];
  tensor_t tqs, tks, tvs, tos;
  DLManagedTensor* dqs = view(&tqs, qs, 3, BUCKET, H, D, 0);
  DLManagedTensor* dks = view(&tks, ks, 3, BUCKET, HKV, D, 0);
  DLManagedTensor* dvs = view(&tvs, vs, 3, BUCKET, HKV, D, 0);
  DLManagedTensor* dos = view(&tos, outs, 3, BUCKET, H, D, 0);
  const step_t dec = {2, {0, 1}, {1, 1}, "decode, graph replay"};
  int ok = 1;
  aar_graph_params_t* g = NULL;
  CHECK(aar_graph_params_create("recording", NULL, 0, &g));
  { /* The capture's build: the next step's shape; nothing runs, nothing is appended. */
    batch_t b = {2, {0, 1, 2}, {seen[0] + 1, seen[1] + 1}, {0}, {0, 0}};
    memcpy(b.rows, table[0], sizeof(table[0]));
    memcpy(b.rows + MAXB, table[1], sizeof(table[1]));
    const aar_gqa_dcp_build_inputs_t in = dcp_inputs(&dec, &b, BUCKET);
    const aar_gqa_dcp_metadata_t* md = NULL;
    CHECK(aar_gqa_dcp_builder_build_for_graph_capture(builder, &in, AAR_STATE_DECODE_ONLY, &md));
    CHECK(aar_graph_begin_capture(g, BUCKET));
    CHECK(aar_gqa_dcp_impl_forward(layer, dqs, dks, dvs, kc, vc, md, dos));
    CHECK(aar_graph_end_capture(g));
  }
  for (int rep = 0; rep < 2; ++rep) {
    batch_t b;
    make_batch(&dec, &b, q, W * H, k, v);
    memset(qs, 0, sizeof(qs));
    memset(ks, 0, sizeof(ks));
    memset(vs, 0, sizeof(vs));
    for (int t = 0; t < b.T; ++t) {
      memcpy(qs + (size_t)t * H * D, q + ((size_t)t * W * H + (size_t)rank * H) * D, sizeof(float) * H * D);
      memcpy(ks + (size_t)t * HKV * D, k + (size_t)t * HKV * D, sizeof(float) * HKV * D);
      memcpy(vs + (size_t)t * HKV * D, v + (size_t)t * HKV * D, sizeof(float) * HKV * D);
    }
    for (int i = 0; i < BUCKET * H * D; ++i) outs[i] = NAN;
    const aar_gqa_dcp_build_inputs_t in = dcp_inputs(&dec, &b, BUCKET);
    const aar_gqa_dcp_metadata_t* md = NULL;
    CHECK(aar_gqa_dcp_builder_build(builder, &in, &md));
    CHECK(aar_graph_update_gqa_dcp(g, BUCKET, md));
    aar_cp_comm_info_t before, after;
    before.struct_size = after.struct_size = sizeof(before);
    CHECK(aar_cp_comm_get_info(comm, &before));
    CHECK(aar_graph_replay(g, BUCKET));
    CHECK(aar_cp_comm_get_info(comm, &after));
    double worst = 0.0;
    for (int t = 0; t < b.T; ++t) {
      const double d = row_diff(&dec, &b, q, W * H, rank * H, t, outs + (size_t)t * H * D);
      if (!(d <= worst)) worst = d;
    }
    printf("rank %d dcp %-26s %2d tokens in a bucket of %d, %lld collectives, max |out - ref| = %.2e\n", rank,
           dec.what, b.T, BUCKET, (long long)(after.calls - before.calls), worst);
    ok = ok && worst < 1e-5 && after.calls > before.calls;
  }
  aar_graph_params_destroy(g);
  return ok;
}

static int run_dcp(int rank, aar_cp_comm_t* comm) {
  static float q[MAXTOK * W * H * D], k[MAXTOK * HKV * D], v[MAXTOK * HKV * D], ql[MAXTOK * H * D], out[MAXTOK * H * D];
  tensor_t tq, tk, tv, tkc, tvc, to;
  int ok = 1;
  reset_model();

  aar_gqa_dcp_builder_config_t bc;
  aar_gqa_dcp_builder_config_init(&bc);
  bc.max_num_reqs = REQS;
  bc.max_num_tokens = MAXTOK;
  bc.max_blocks_per_req = MAXB;
  bc.block_size = BS;
  bc.num_blocks = NB;
  bc.dcp_world_size = W;
  bc.dcp_rank = rank;
  aar_gqa_dcp_builder_t* builder = NULL;
  CHECK(aar_gqa_dcp_builder_create(&bc, &builder));

  aar_gqa_impl_config_t ic;
  aar_gqa_impl_config_init(&ic);
  ic.num_heads = H; /* this rank's query heads: [rank * H, (rank + 1) * H) of W * H */
  ic.num_kv_heads = HKV;
  ic.head_size = D;
  aar_gqa_dcp_impl_t* layer = NULL;
  CHECK(aar_gqa_dcp_impl_create(&ic, comm, &layer));
  DLManagedTensor* kc = view(&tkc, &k_cache[0][0][0][0], 4, NB, BS, HKV, D);
  DLManagedTensor* vc = view(&tvc, &v_cache[0][0][0][0], 4, NB, BS, HKV, D);

  const step_t steps[3] = {{2, {0, 1}, {13, 20}, "prefill"},
                           {2, {0, 1}, {1, 1}, "decode"},
                           {2, {0, 1}, {1, 5}, "decode + chunked prefill"}};
  for (int si = 0; si < 3; ++si) {
    const step_t* s = &steps[si];
    batch_t b;
    make_batch(s, &b, q, W * H, k, v);
    for (int t = 0; t < b.T; ++t) { /* this rank's heads of the global query */
      memcpy(ql + (size_t)t * H * D, q + ((size_t)t * W * H + (size_t)rank * H) * D, sizeof(float) * H * D);
    }
    const aar_gqa_dcp_build_inputs_t in = dcp_inputs(s, &b, 0);
    const aar_gqa_dcp_metadata_t* md = NULL;
    CHECK(aar_gqa_dcp_builder_build(builder, &in, &md));
    aar_gqa_dcp_metadata_info_t info;
    info.struct_size = sizeof(info);
    CHECK(aar_gqa_dcp_metadata_get_info(md, &info));
    aar_cp_comm_info_t before, after;
    before.struct_size = after.struct_size = sizeof(before);
    CHECK(aar_cp_comm_get_info(comm, &before));
    for (int i = 0; i < b.T * H * D; ++i) out[i] = NAN;
    CHECK(aar_gqa_dcp_impl_forward(layer, view(&tq, ql, 3, b.T, H, D, 0), view(&tk, k, 3, b.T, HKV, D, 0),
                                   view(&tv, v, 3, b.T, HKV, D, 0), kc, vc, md, view(&to, out, 3, b.T, H, D, 0)));
    CHECK(aar_cp_comm_get_info(comm, &after));
    double worst = 0.0;
    for (int t = 0; t < b.T; ++t) {
      const double d = row_diff(s, &b, q, W * H, rank * H, t, out + (size_t)t * H * D);
      if (!(d <= worst)) worst = d; /* NaN-safe: a NaN row makes worst NaN */
    }
    printf("rank %d dcp %-26s %2d tokens (%d decodes, %d prefills), %d KV rows written here, %lld collectives, "
           "max |out - ref| = %.2e\n",
           rank, s->what, b.T, info.num_decodes, info.num_prefills, info.num_local_writes,
           (long long)(after.calls - before.calls), worst);
    ok = ok && worst < 1e-5;
    /* A fresh prefill attends only its own chunk: no collective; decodes and context: some. */
    ok = ok && ((si == 0) == (after.calls == before.calls));
  }
  ok = run_dcp_graph(rank, comm, builder, layer, kc, vc) && ok;

  /* Metadata built for another rank of the group is refused before any collective (every
   * rank of the group makes the same mistake here, so none is left waiting). */
  aar_gqa_dcp_builder_config_t bad_cfg = bc;
  bad_cfg.dcp_rank = 1 - rank;
  aar_gqa_dcp_builder_t* other = NULL;
  CHECK(aar_gqa_dcp_builder_create(&bad_cfg, &other));
  {
    const int32_t qsl[2] = {0, 1}, seq[1] = {1};
    aar_gqa_dcp_build_inputs_t in;
    aar_gqa_dcp_build_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = 2;
    in.seq_lens = seq;
    in.seq_lens_len = 1;
    in.block_table = table[0];
    in.block_table_len = MAXB;
    in.block_table_stride = MAXB;
    const aar_gqa_dcp_metadata_t* md = NULL;
    CHECK(aar_gqa_dcp_builder_build(other, &in, &md));
    ok &= expect_rejected(aar_gqa_dcp_impl_forward(layer, view(&tq, ql, 3, 1, H, D, 0), view(&tk, k, 3, 1, HKV, D, 0),
                                                   view(&tv, v, 3, 1, HKV, D, 0), kc, vc, md,
                                                   view(&to, out, 3, 1, H, D, 0)),
                          "built for DCP rank", "metadata of another rank");
  }
  aar_gqa_dcp_builder_destroy(other);
  ok &= expect_rejected(aar_gqa_dcp_impl_create(&ic, NULL, &layer), "comm is NULL", "comm NULL");
  aar_gqa_dcp_impl_destroy(layer);
  aar_gqa_dcp_builder_destroy(builder);
  return ok;
}

/* ------------------------------------------------------------------ PCP */

enum { SPEC = 2 }; /* PCP's draft tokens per request: decodes of up to 1 + SPEC tokens */

static aar_gqa_pcp_build_inputs_t pcp_inputs(const step_t* s, const batch_t* b, int num_input_tokens) {
  aar_gqa_pcp_build_inputs_t in;
  aar_gqa_pcp_build_inputs_init(&in);
  in.query_start_loc = b->qsl;
  in.query_start_loc_len = s->n + 1;
  in.seq_lens = b->seq;
  in.seq_lens_len = s->n;
  in.block_table = b->rows;
  in.block_table_len = s->n * MAXB;
  in.block_table_stride = MAXB;
  in.is_prefilling = b->pref;
  in.is_prefilling_len = s->n;
  in.num_input_tokens = num_input_tokens;
  return in;
}

/* A decode step: every request of s decodes (its q_len <= 1 + SPEC tokens, none prefilling). */
static void make_decode_batch(const step_t* s, batch_t* b, float* q, float* k, float* v) {
  make_batch(s, b, q, H, k, v);
  for (int i = 0; i < s->n; ++i) b->pref[i] = 0;
}

/* This rank's local rows (token_index[i]: the global row, -1 padding) of the step's global q /
 * k / v; padding rows get large values, which must never reach a real row. */
static void gather_local(size_t n, const int32_t* token_index, const float* q, const float* k, const float* v,
                         float* lq, float* lk, float* lv) {
  for (size_t i = 0; i < n; ++i) {
    const int t = token_index[i];
    for (int j = 0; j < H * D; ++j) lq[i * H * D + j] = t >= 0 ? q[(size_t)t * H * D + j] : 50.0f;
    for (int j = 0; j < HKV * D; ++j) {
      lk[i * HKV * D + j] = t >= 0 ? k[(size_t)t * HKV * D + j] : -50.0f;
      lv[i * HKV * D + j] = t >= 0 ? v[(size_t)t * HKV * D + j] : 50.0f;
    }
  }
}

/* max |out - ref| over the real local rows (and how many there were). */
static double pcp_worst(const step_t* s, const batch_t* b, const float* q, size_t n, const int32_t* token_index,
                        const float* out, int* real) {
  double worst = 0.0;
  *real = 0;
  for (size_t i = 0; i < n; ++i) {
    if (token_index[i] < 0) continue;
    ++*real;
    const double d = row_diff(s, b, q, H, 0, token_index[i], out + i * H * D);
    if (!(d <= worst)) worst = d; /* NaN-safe */
  }
  return worst;
}

/* Graph mode: a decode bucket captured once (build_for_graph_capture, SPEC_DECODING) on static
 * buffers, then decode steps padded to it (a speculative one and a one-token one: build,
 * local rows, update, replay), each checked against the float64 reference. Sharded: the
 * collectives run inside the replay; replicated: a decode has none. */
static int run_pcp_graph(int rank, aar_cp_comm_t* comm, aar_pcp_kv_mode_t mode, aar_gqa_pcp_builder_t* builder,
                         aar_gqa_pcp_impl_t* layer, DLManagedTensor* kc, DLManagedTensor* vc) {
  enum { BUCKET = 8 };
  static float q[MAXTOK * H * D], k[MAXTOK * HKV * D], v[MAXTOK * HKV * D];
  static float qs[BUCKET * H * D], ks[BUCKET * HKV * D], vs[BUCKET * HKV * D], outs[BUCKET * H * D];
  static int32_t token_index[BUCKET];
  tensor_t tqs, tks, tvs, tos;
  DLManagedTensor* dqs = view(&tqs, qs, 3, BUCKET, H, D, 0);
  DLManagedTensor* dks = view(&tks, ks, 3, BUCKET, HKV, D, 0);
  DLManagedTensor* dvs = view(&tvs, vs, 3, BUCKET, HKV, D, 0);
  DLManagedTensor* dos = view(&tos, outs, 3, BUCKET, H, D, 0);
  const step_t steps[2] = {{2, {0, 1}, {1 + SPEC, 2}, "spec decode, graph replay"},
                           {2, {0, 1}, {1, 1}, "decode, graph replay"}};
  int ok = 1;
  aar_graph_params_t* g = NULL;
  CHECK(aar_graph_params_create("recording", NULL, 0, &g));
  { /* The capture's build: a speculative step's shape; nothing runs, nothing is appended. */
    const step_t cap = {2, {0, 1}, {1 + SPEC, 1 + SPEC}, "capture"};
    batch_t b = {2 * (1 + SPEC), {0, 1 + SPEC, 2 * (1 + SPEC)}, {seen[0] + 1 + SPEC, seen[1] + 1 + SPEC}, {0}, {0, 0}};
    memcpy(b.rows, table[0], sizeof(table[0]));
    memcpy(b.rows + MAXB, table[1], sizeof(table[1]));
    const aar_gqa_pcp_build_inputs_t in = pcp_inputs(&cap, &b, BUCKET);
    const aar_gqa_pcp_metadata_t* md = NULL;
    /* A state other than DECODE_ONLY / SPEC_DECODING is not capturable: refused by name (not
     * supported), nothing built. */
    const aar_gqa_pcp_metadata_t* none = NULL;
    const aar_status_t st = aar_gqa_pcp_builder_build_for_graph_capture(builder, &in, AAR_STATE_CHUNKED_PREFILL, &none);
    const int refused = st == AAR_ERR_NOT_SUPPORTED && strstr(aar_last_error(), "gqa_pcp") != NULL && none == NULL;
    printf("bad %-28s -> %s: %s%s\n", "capture state CHUNKED_PREFILL", aar_status_name(st), aar_last_error(),
           refused ? "" : "  (UNEXPECTED)");
    ok &= refused;
    CHECK(aar_gqa_pcp_builder_build_for_graph_capture(builder, &in, AAR_STATE_SPEC_DECODING, &md));
    aar_gqa_pcp_metadata_info_t info;
    info.struct_size = sizeof(info);
    CHECK(aar_gqa_pcp_metadata_get_info(md, &info));
    ok = ok && info.num_local_tokens == BUCKET && info.attn_state == AAR_STATE_SPEC_DECODING;
    CHECK(aar_graph_begin_capture(g, BUCKET));
    CHECK(aar_gqa_pcp_impl_forward(layer, dqs, dks, dvs, kc, vc, md, dos));
    CHECK(aar_graph_end_capture(g));
  }
  for (int si = 0; si < 2; ++si) {
    const step_t* s = &steps[si];
    batch_t b;
    make_decode_batch(s, &b, q, k, v);
    const aar_gqa_pcp_build_inputs_t in = pcp_inputs(s, &b, BUCKET);
    const aar_gqa_pcp_metadata_t* md = NULL;
    CHECK(aar_gqa_pcp_builder_build(builder, &in, &md));
    size_t n = 0;
    CHECK(aar_gqa_pcp_builder_local_rows(builder, token_index, NULL, BUCKET, &n));
    gather_local(n, token_index, q, k, v, qs, ks, vs);
    for (int i = 0; i < BUCKET * H * D; ++i) outs[i] = NAN;
    CHECK(aar_graph_update_gqa_pcp(g, BUCKET, md));
    aar_cp_comm_info_t before, after;
    before.struct_size = after.struct_size = sizeof(before);
    CHECK(aar_cp_comm_get_info(comm, &before));
    CHECK(aar_graph_replay(g, BUCKET));
    CHECK(aar_cp_comm_get_info(comm, &after));
    int real = 0;
    const double worst = pcp_worst(s, &b, q, n, token_index, outs, &real);
    printf("rank %d pcp %-10s %-26s %2d tokens in a bucket of %d, %lld collectives, max |out - ref| = %.2e\n", rank,
           mode == AAR_PCP_SHARDED ? "sharded" : "replicated", s->what, b.T, BUCKET,
           (long long)(after.calls - before.calls), worst);
    ok = ok && worst < 1e-5 && n == BUCKET && real == b.T;
    ok = ok && ((mode == AAR_PCP_SHARDED) == (after.calls > before.calls));
  }
  ok &= expect_rejected(aar_graph_update_gqa_pcp(g, BUCKET, NULL), "metadata is NULL", "update without metadata");
  aar_graph_params_destroy(g);
  return ok;
}

static int run_pcp(int rank, aar_cp_comm_t* comm, aar_pcp_kv_mode_t mode) {
  static float q[MAXTOK * H * D], k[MAXTOK * HKV * D], v[MAXTOK * HKV * D];
  static float lq[MAXTOK * H * D], lk[MAXTOK * HKV * D], lv[MAXTOK * HKV * D], out[MAXTOK * H * D];
  static int32_t token_index[MAXTOK];
  tensor_t tq, tk, tv, tkc, tvc, to;
  int ok = 1;
  reset_model();

  aar_gqa_pcp_builder_config_t bc;
  aar_gqa_pcp_builder_config_init(&bc);
  bc.max_num_reqs = REQS;
  bc.max_num_tokens = MAXTOK;
  bc.max_blocks_per_req = MAXB;
  bc.block_size = BS;
  bc.num_blocks = NB;
  bc.pcp_size = W;
  bc.pcp_rank = rank;
  bc.kv_mode = mode;
  aar_gqa_pcp_builder_ext_t ext; /* version 5: speculative decode */
  aar_gqa_pcp_builder_ext_init(&ext);
  ext.num_speculative_tokens = SPEC;
  aar_gqa_pcp_builder_t* builder = NULL;
  ok &= expect_rejected(aar_gqa_pcp_builder_create_ext(&bc, NULL, &builder), "ext is NULL", "create_ext ext NULL");
  CHECK(aar_gqa_pcp_builder_create_ext(&bc, &ext, &builder));

  aar_gqa_impl_config_t ic;
  aar_gqa_impl_config_init(&ic);
  ic.num_heads = H; /* PCP splits tokens, not heads: every rank has all of them */
  ic.num_kv_heads = HKV;
  ic.head_size = D;
  aar_gqa_pcp_impl_t* layer = NULL;
  CHECK(aar_gqa_pcp_impl_create(&ic, comm, NULL, &layer));
  DLManagedTensor* kc = view(&tkc, &k_cache[0][0][0][0], 4, NB, BS, HKV, D);
  DLManagedTensor* vc = view(&tvc, &v_cache[0][0][0][0], 4, NB, BS, HKV, D);

  const step_t steps[3] = {{2, {0, 1}, {17, 6}, "prefill"},
                           {2, {0, 1}, {1, 9}, "decode + chunked prefill"},
                           {2, {0, 1}, {1 + SPEC, 2}, "spec decode"}};
  for (int si = 0; si < 3; ++si) {
    const step_t* s = &steps[si];
    batch_t b;
    if (si == 2) {
      make_decode_batch(s, &b, q, k, v);
    } else {
      make_batch(s, &b, q, H, k, v);
    }
    const aar_gqa_pcp_build_inputs_t in = pcp_inputs(s, &b, 0);
    const aar_gqa_pcp_metadata_t* md = NULL;
    CHECK(aar_gqa_pcp_builder_build(builder, &in, &md));
    aar_gqa_pcp_metadata_info_t info;
    info.struct_size = sizeof(info);
    CHECK(aar_gqa_pcp_metadata_get_info(md, &info));
    size_t n = 0;
    CHECK(aar_gqa_pcp_builder_local_rows(builder, token_index, NULL, MAXTOK, &n));
    gather_local(n, token_index, q, k, v, lq, lk, lv);
    for (size_t i = 0; i < n * H * D; ++i) out[i] = NAN;
    CHECK(aar_gqa_pcp_impl_forward(layer, view(&tq, lq, 3, (int64_t)n, H, D, 0), view(&tk, lk, 3, (int64_t)n, HKV, D, 0),
                                   view(&tv, lv, 3, (int64_t)n, HKV, D, 0), kc, vc, md,
                                   view(&to, out, 3, (int64_t)n, H, D, 0)));
    int real = 0;
    const double worst = pcp_worst(s, &b, q, n, token_index, out, &real);
    printf("rank %d pcp %-10s %-26s %2d tokens, %zu local rows (%d real), context %s, max |out - ref| = %.2e\n",
           rank, mode == AAR_PCP_SHARDED ? "sharded" : "replicated", s->what, b.T, n, real,
           info.has_context ? "yes" : "no", worst);
    ok = ok && worst < 1e-5 && (size_t)info.num_local_tokens == n && real > 0;
    /* The speculative step is all decodes (replicated on every rank, not split). */
    if (si == 2) ok = ok && info.attn_state == AAR_STATE_SPEC_DECODING && info.num_prefills == 0 && real == b.T;
  }
  ok = run_pcp_graph(rank, comm, mode, builder, layer, kc, vc) && ok;
  /* A capacity below the local row count is refused, nothing written. */
  size_t n = 0;
  ok &= expect_rejected(aar_gqa_pcp_builder_local_rows(builder, token_index, NULL, 1, &n), "capacity=1",
                        "local_rows capacity");
  aar_gqa_pcp_impl_destroy(layer);
  aar_gqa_pcp_builder_destroy(builder);
  return ok;
}

/* ------------------------------------------------------------------ processes */

static int run_all(int rank, aar_cp_comm_t* comm) {
  int ok = run_dcp(rank, comm);
  ok = run_pcp(rank, comm, AAR_PCP_SHARDED) && ok;
  ok = run_pcp(rank, comm, AAR_PCP_REPLICATED) && ok;
  return ok;
}

int main(int argc, char** argv) {
  return cp_main(argc, argv, W, DEADLINE_S, COMM_TIMEOUT_MS, run_all, "OK: both ranks match the float64 reference");
}
