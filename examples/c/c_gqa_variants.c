/* A C11 engine running the GQA variants through the C ABI (ascend_attn_rt/c_api.h):
 * one GQA metadata builder (block size 128) whose metadata drives an FA3 layer
 * (K/V read back from a float paged cache) and a C8 layer (a static INT8 KV cache
 * with per-channel scales and offsets). Two requests: a prefill, decodes, the
 * second request joining late. Every step's output is checked against float64
 * attention over the step's float K/V computed here: FA3 to float32 rounding,
 * C8 to its INT8 quantisation error (the decode reads the cache back through the
 * scales). Then a few bad calls, each rejected by name with nothing written.
 *
 * Build: examples/c/CMakeLists.txt; ctest `example_c_gqa_variants` runs it. */
#include "c_example.h"

enum { H = 4, HKV = 2, D = 32, BS = 128, NB = 4, MAXB = 2, REQS = 2, TOK = 40, STEPS = 4 };

static float k_hist[REQS][TOK][HKV][D], v_hist[REQS][TOK][HKV][D];
static float fa3_k[NB][BS][HKV][D], fa3_v[NB][BS][HKV][D];
static int8_t c8_k[NB][BS][HKV][D], c8_v[NB][BS][HKV][D]; /* the ND shape holding NZ bytes */
static float k_scale[HKV * D], k_offset[HKV * D], v_scale[HKV * D], v_offset[HKV * D];

int main(void) {
  static float q[TOK * H * D], k[TOK * HKV * D], v[TOK * HKV * D], out[2][TOK * H * D];
  tensor_t tq, tk, tv, to[2], tks, tko, tvs, tvo, tkc[2], tvc[2];
  int ok = 1;
  if (aar_c_api_version() != AAR_C_API_VERSION) {
    fprintf(stderr, "c_api.h is version %d, libascend_attn_rt_c %d\n", AAR_C_API_VERSION, aar_c_api_version());
    return 1;
  }
  /* K/V lie in [-1, 1): a step of 1/100 per level, integer offsets in [-2, 2]. */
  for (int i = 0; i < HKV * D; ++i) {
    k_scale[i] = 0.01f, v_scale[i] = 0.01f;
    k_offset[i] = (float)(i % 5 - 2), v_offset[i] = 0.0f;
  }

  aar_gqa_builder_config_t bc;
  aar_gqa_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = TOK;
  bc.max_blocks_per_req = MAXB;
  bc.block_size = BS;
  bc.num_blocks = NB;
  aar_gqa_builder_t* builder = NULL;
  CHECK(aar_gqa_builder_create(&bc, &builder));

  aar_fa3_impl_config_t fc;
  aar_fa3_impl_config_init(&fc);
  fc.num_heads = H;
  fc.num_kv_heads = HKV;
  fc.head_size = D;
  aar_fa3_impl_t* fa3 = NULL;
  CHECK(aar_fa3_impl_create(&fc, &fa3));
  aar_c8_impl_config_t cc;
  aar_c8_impl_config_init(&cc);
  cc.num_heads = H;
  cc.num_kv_heads = HKV;
  cc.head_size = D;
  cc.k_scale = view(&tks, k_scale, 1, HKV * D, 0, 0, 0);
  cc.k_offset = view(&tko, k_offset, 1, HKV * D, 0, 0, 0);
  cc.v_scale = view(&tvs, v_scale, 1, HKV * D, 0, 0, 0);
  cc.v_offset = view(&tvo, v_offset, 1, HKV * D, 0, 0, 0);
  aar_c8_impl_t* c8 = NULL;
  CHECK(aar_c8_impl_create(&cc, &c8));

  const DLManagedTensor* fk = view(&tkc[0], &fa3_k[0][0][0][0], 4, NB, BS, HKV, D);
  const DLManagedTensor* fv = view(&tvc[0], &fa3_v[0][0][0][0], 4, NB, BS, HKV, D);
  const DLManagedTensor* ck = view_typed(&tkc[1], &c8_k[0][0][0][0], kDLInt, 8, 4, NB, BS, HKV, D);
  const DLManagedTensor* cv = view_typed(&tvc[1], &c8_v[0][0][0][0], kDLInt, 8, 4, NB, BS, HKV, D);

  const int32_t table[REQS * MAXB] = {2, 0, /**/ 1, 3};
  /* (request, new tokens) per step, decodes first. */
  const int steps[STEPS][2][2] = {{{0, 7}, {-1, 0}}, {{0, 1}, {-1, 0}}, {{0, 1}, {1, 12}}, {{0, 1}, {1, 1}}};
  int seen[REQS] = {0, 0};
  const aar_gqa_metadata_t* md = NULL;
  for (int step = 0; step < STEPS; ++step) {
    int32_t qsl[REQS + 1] = {0}, seq[REQS], rows[REQS * MAXB];
    int n = 0, t = 0;
    for (int e = 0; e < 2 && steps[step][e][0] >= 0; ++e, ++n) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      fill(&k_hist[r][seen[r]][0][0], (size_t)q_len * HKV * D);
      fill(&v_hist[r][seen[r]][0][0], (size_t)q_len * HKV * D);
      memcpy(k + (size_t)t * HKV * D, k_hist[r][seen[r]], sizeof(float) * q_len * HKV * D);
      memcpy(v + (size_t)t * HKV * D, v_hist[r][seen[r]], sizeof(float) * q_len * HKV * D);
      memcpy(rows + n * MAXB, table + r * MAXB, sizeof(int32_t) * MAXB);
      seen[r] += q_len;
      t += q_len;
      qsl[n + 1] = t;
      seq[n] = seen[r];
    }
    fill(q, (size_t)t * H * D);
    aar_gqa_build_inputs_t in;
    aar_gqa_build_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = n + 1;
    in.seq_lens = seq;
    in.seq_lens_len = n;
    in.block_table = rows;
    in.block_table_len = n * MAXB;
    in.block_table_stride = MAXB;
    CHECK(aar_gqa_builder_build(builder, &in, &md));
    DLManagedTensor* dq = view(&tq, q, 3, t, H, D, 0);
    DLManagedTensor* dk = view(&tk, k, 3, t, HKV, D, 0);
    DLManagedTensor* dv = view(&tv, v, 3, t, HKV, D, 0);
    CHECK(aar_fa3_impl_forward(fa3, dq, dk, dv, fk, fv, md, view(&to[0], out[0], 3, t, H, D, 0)));
    CHECK(aar_c8_impl_forward(c8, dq, dk, dv, ck, cv, md, view(&to[1], out[1], 3, t, H, D, 0)));
    double worst[2] = {0.0, 0.0};
    int row = 0;
    for (int e = 0; e < n; ++e) {
      const int r = steps[step][e][0], q_len = steps[step][e][1];
      for (int i = 0; i < q_len; ++i, ++row) {
        const int pos = seen[r] - q_len + i;
        for (int l = 0; l < 2; ++l) {
          const double diff = gqa_row_diff(q + (size_t)row * H * D, &k_hist[r][0][0][0], &v_hist[r][0][0][0], pos + 1,
                                           H, HKV, D, out[l] + (size_t)row * H * D);
          if (diff > worst[l]) worst[l] = diff;
        }
      }
    }
    printf("step %d: %d requests, %d tokens: fa3 (%s) max |out - ref| = %.2e, c8 (%s) %.2e\n", step, n, t,
           aar_fa3_impl_last_path(fa3), worst[0], aar_c8_impl_last_path(c8), worst[1]);
    ok = ok && worst[0] < 1e-5 && worst[1] < 1e-2;
  }

  /* Bad input: a status and a message naming the argument; nothing written. */
  static int8_t c8_before[NB][BS][HKV][D];
  memcpy(c8_before, c8_k, sizeof(c8_before));
  const float fa3_before = fa3_k[table[0]][0][0][0];
  DLManagedTensor* dq = view(&tq, q, 3, 2, H, D, 0);
  DLManagedTensor* dk = view(&tk, k, 3, 2, HKV, D, 0);
  DLManagedTensor* dv = view(&tv, v, 3, 2, HKV, D, 0);
  ok = ok && expect_rejected(aar_c8_impl_forward(c8, dq, dk, dv, fk, fv, md, &to[1].m), "key_cache",
                             "c8 given float caches");
  ok = ok && expect_rejected(aar_fa3_impl_forward(fa3, dq, dk, NULL, fk, fv, md, &to[0].m),
                             "key and value must both be given", "fa3 without value");
  ok = ok && expect_rejected(aar_fa3_impl_forward((aar_fa3_impl_t*)c8, dq, dk, dv, fk, fv, md, &to[0].m),
                             "impl is an aar_c8_impl_t", "c8 layer given to fa3");
  cc.head_size = 24;
  aar_c8_impl_t* bad = NULL;
  ok = ok && expect_rejected(aar_c8_impl_create(&cc, &bad), "head_size", "c8 head_size 24");
  ok = ok && bad == NULL && memcmp(c8_before, c8_k, sizeof(c8_before)) == 0 && fa3_k[table[0]][0][0][0] == fa3_before;

  aar_c8_impl_destroy(c8);
  aar_fa3_impl_destroy(fa3);
  aar_gqa_builder_destroy(builder);
  printf("%s\n", ok ? "c_gqa_variants: OK" : "c_gqa_variants: FAILED");
  return ok ? 0 : 1;
}
