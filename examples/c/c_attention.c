/* A C11 engine calling the runtime through its C ABI (ascend_attn_rt/c_api.h):
 * one paged KV cache, a GQA metadata builder and layer; a prefill of two
 * requests, two eager decode steps, then two decode steps through graph mode
 * (a captured bucket, updated and replayed each step). Every step's output is
 * checked against a float64 attention computed here with plain loops. Then a
 * few bad calls, each rejected with a status and a message naming the argument.
 *
 * Build: examples/c/CMakeLists.txt (find_package(ascend_attn_rt COMPONENTS
 * c_api)); ctest `example_c_attention` runs it. */
#include <ascend_attn_rt/c_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H = 4, HKV = 2, D = 32, BS = 8, NB = 16, REQS = 2, MAXTOK = 64, WIDTH = 8 };

#define CHECK(call)                                                                         \
  do {                                                                                      \
    aar_status_t st_ = (call);                                                              \
    if (st_ != AAR_OK) {                                                                    \
      fprintf(stderr, "%s:%d %s -> %s: %s\n", __FILE__, __LINE__, #call, aar_status_name(st_), \
              aar_last_error());                                                            \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

/* A borrowed view of a float32 host array as a DLPack tensor (compact, row-major). */
typedef struct {
  DLManagedTensor m;
  int64_t shape[4];
} tensor_t;

static DLManagedTensor* view(tensor_t* t, float* data, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  const int64_t dims[4] = {d0, d1, d2, d3};
  memset(t, 0, sizeof(*t));
  memcpy(t->shape, dims, sizeof(dims));
  t->m.dl_tensor.data = data;
  t->m.dl_tensor.device.device_type = kDLCPU;
  t->m.dl_tensor.ndim = ndim;
  t->m.dl_tensor.dtype.code = kDLFloat;
  t->m.dl_tensor.dtype.bits = 32;
  t->m.dl_tensor.dtype.lanes = 1;
  t->m.dl_tensor.shape = t->shape;
  t->m.dl_tensor.strides = NULL;
  return &t->m;
}

static unsigned long long rng = 12345;
static float uniform(void) { /* in [-1, 1) */
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((rng >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}
static void fill(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = uniform();
}

/* Every K/V row each request has seen, in order (the float64 reference reads these). */
static float k_hist[REQS][MAXTOK][HKV][D], v_hist[REQS][MAXTOK][HKV][D];
static int seen[REQS];

/* Causal attention of the step's tokens over each request's history, in double;
 * returns max |out - ref|. q/out rows: request after request. */
static double check(const float* q, const float* out, const int* q_len) {
  const double scale = 1.0 / sqrt((double)D);
  double worst = 0.0, scores[MAXTOK];
  int row = 0;
  for (int r = 0; r < REQS; ++r) {
    for (int i = 0; i < q_len[r]; ++i, ++row) {
      const int pos = seen[r] - q_len[r] + i;
      for (int h = 0; h < H; ++h) {
        const int g = h / (H / HKV);
        const float* qv = q + ((size_t)row * H + h) * D;
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j <= pos; ++j) {
          double s = 0.0;
          for (int d = 0; d < D; ++d) s += (double)qv[d] * k_hist[r][j][g][d];
          scores[j] = s * scale;
          if (scores[j] > mx) mx = scores[j];
        }
        for (int j = 0; j <= pos; ++j) sum += (scores[j] = exp(scores[j] - mx));
        for (int d = 0; d < D; ++d) {
          double ref = 0.0;
          for (int j = 0; j <= pos; ++j) ref += scores[j] / sum * v_hist[r][j][g][d];
          const double diff = fabs(ref - out[((size_t)row * H + h) * D + d]);
          if (diff > worst) worst = diff;
        }
      }
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

static int expect_rejected(aar_status_t st, const char* needle, const char* what) {
  const int ok = st == AAR_ERR_INVALID_ARGUMENT && strstr(aar_last_error(), needle) != NULL;
  printf("bad %-28s -> %s: %s%s\n", what, aar_status_name(st), aar_last_error(), ok ? "" : "  (UNEXPECTED)");
  return ok;
}

static float k_cache[NB][BS][HKV][D], v_cache[NB][BS][HKV][D];

int main(void) {
  static float q[MAXTOK * H * D], k[MAXTOK * HKV * D], v[MAXTOK * HKV * D], out[MAXTOK * H * D];
  tensor_t tq, tk, tv, tkc, tvc, to;
  int ok = 1;

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
  ok = ok && k_cache[0][0][0][0] == cache_before && graph != NULL;

  aar_graph_params_destroy(graph);
  aar_gqa_impl_destroy(layer);
  aar_gqa_builder_destroy(builder);
  printf("%s\n", ok ? "c_attention: OK" : "c_attention: FAILED");
  return ok ? 0 : 1;
}
