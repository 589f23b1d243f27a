/* Shared by the C examples (c_attention.c, c_sfa.c, ...): the status check, borrowed
 * DLPack views of host float32 arrays, a deterministic generator, the check of a
 * rejected call, and the float64 references of a GQA query row and of one
 * latent-attention (MLA-style) layer without q-LoRA. Pure C11, header only (each example is one program). */
#ifndef AAR_C_EXAMPLE_H_
#define AAR_C_EXAMPLE_H_

#include <ascend_attn_rt/c_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                         \
  do {                                                                                      \
    aar_status_t st_ = (call);                                                              \
    if (st_ != AAR_OK) {                                                                    \
      fprintf(stderr, "%s:%d %s -> %s: %s\n", __FILE__, __LINE__, #call, aar_status_name(st_), \
              aar_last_error());                                                            \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

/* A borrowed view of a host array as a DLPack tensor (compact, row-major). */
typedef struct {
  DLManagedTensor m;
  int64_t shape[4];
} tensor_t;

static inline DLManagedTensor* view_typed(tensor_t* t, void* data, uint8_t code, uint8_t bits, int ndim, int64_t d0,
                                   int64_t d1, int64_t d2, int64_t d3) {
  const int64_t dims[4] = {d0, d1, d2, d3};
  memset(t, 0, sizeof(*t));
  memcpy(t->shape, dims, sizeof(dims));
  t->m.dl_tensor.data = data;
  t->m.dl_tensor.device.device_type = kDLCPU;
  t->m.dl_tensor.ndim = ndim;
  t->m.dl_tensor.dtype.code = code;
  t->m.dl_tensor.dtype.bits = bits;
  t->m.dl_tensor.dtype.lanes = 1;
  t->m.dl_tensor.shape = t->shape;
  t->m.dl_tensor.strides = NULL;
  return &t->m;
}

/* float32 */
static inline DLManagedTensor* view(tensor_t* t, float* data, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  return view_typed(t, data, kDLFloat, 32, ndim, d0, d1, d2, d3);
}
static inline DLManagedTensor* view2(tensor_t* t, float* data, int64_t d0, int64_t d1) {
  return view(t, data, 2, d0, d1, 0, 0);
}

static unsigned long long rng = 12345;
static inline float uniform(void) { /* in [-1, 1) */
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((rng >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}
static inline void fill(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = uniform();
}

static inline int expect_rejected(aar_status_t st, const char* needle, const char* what) {
  const int ok = st == AAR_ERR_INVALID_ARGUMENT && strstr(aar_last_error(), needle) != NULL;
  printf("bad %-28s -> %s: %s%s\n", what, aar_status_name(st), aar_last_error(), ok ? "" : "  (UNEXPECTED)");
  return ok;
}

/* ------------------------------------------------------------------ GQA reference
 * Attention of one query row q (H, D) over the first n rows of a request's keys and
 * values (each (n, HKV, D), row-major; head h reads KV head h / (H / HKV)), in
 * float64; returns max |ref - out| over out (H, D). */
static inline double gqa_row_diff(const float* q, const float* k, const float* v, int n, int H, int HKV, int D,
                                  const float* out) {
  const double scale = 1.0 / sqrt((double)D);
  double worst = 0.0;
  double* p = malloc(sizeof(double) * (n > 0 ? n : 1));
  for (int h = 0; h < H; ++h) {
    const int g = h / (H / HKV);
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < n; ++j) {
      double s = 0.0;
      for (int d = 0; d < D; ++d) s += (double)q[h * D + d] * k[((size_t)j * HKV + g) * D + d];
      p[j] = s * scale;
      if (p[j] > mx) mx = p[j];
    }
    for (int j = 0; j < n; ++j) sum += (p[j] = exp(p[j] - mx));
    for (int d = 0; d < D; ++d) {
      double ref = 0.0;
      for (int j = 0; j < n; ++j) ref += p[j] / sum * v[((size_t)j * HKV + g) * D + d];
      const double diff = fabs(ref - out[h * D + d]);
      if (diff > worst) worst = diff;
    }
  }
  free(p);
  return worst;
}

/* ------------------------------------------------------------------ latent attention reference
 * One DeepSeek-style latent layer (no q-LoRA) in float64, un-absorbed: projections,
 * RMSNorm of the latent (eps 1e-6), interleaved (GPT-J) RoPE, causal softmax over
 * positions [0, pos], o_proj. Weights in torch layout (out, in), row-major. */
typedef struct {
  int heads, hidden, lora, nope, rope, v; /* H, hidden, L, P, R, V */
  const float *w_q, *w_kva, *g_kv, *w_kvb, *w_o; /* (H(P+R), hid), (L+R, hid), (L), (H(P+V), L), (hid, HV) */
  const double* inv_freq;                        /* (R/2) */
} latent_layer_t;

static inline void latent_rope(const latent_layer_t* m, double* y, const double* x, int pos) {
  for (int i = 0; i < m->rope / 2; ++i) {
    const double c = cos(pos * m->inv_freq[i]), s = sin(pos * m->inv_freq[i]);
    y[2 * i] = x[2 * i] * c - x[2 * i + 1] * s;
    y[2 * i + 1] = x[2 * i + 1] * c + x[2 * i] * s;
  }
}

static inline void matvec(double* y, const float* w, const float* xf, const double* xd, int rows, int cols) {
  for (int o = 0; o < rows; ++o) {
    double acc = 0.0;
    for (int i = 0; i < cols; ++i) acc += (double)w[(size_t)o * cols + i] * (xf ? (double)xf[i] : xd[i]);
    y[o] = acc;
  }
}

/* out (hidden): the layer's output for the token at `pos` of a request whose hidden
 * states so far are x (pos + 1 rows of `hidden`). */
static inline void latent_reference(const latent_layer_t* m, double* out, const float* x, int pos) {
  const int H = m->heads, L = m->lora, P = m->nope, R = m->rope, V = m->v, HID = m->hidden, n = pos + 1;
  double* k_nope = malloc(sizeof(double) * n * H * P);
  double* vv = malloc(sizeof(double) * n * H * V);
  double* k_rope = malloc(sizeof(double) * n * R);
  double* kv = malloc(sizeof(double) * (L + R));
  double* c = malloc(sizeof(double) * L);
  double* kvb = malloc(sizeof(double) * H * (P + V));
  double* q = malloc(sizeof(double) * H * (P + R));
  double* o = malloc(sizeof(double) * H * V);
  double* p = malloc(sizeof(double) * n);
  double* q_rope = malloc(sizeof(double) * R);
  const double scale = 1.0 / sqrt((double)(P + R));
  for (int j = 0; j < n; ++j) {
    double ms = 0.0;
    matvec(kv, m->w_kva, x + (size_t)j * HID, NULL, L + R, HID);
    for (int i = 0; i < L; ++i) ms += kv[i] * kv[i] / L;
    for (int i = 0; i < L; ++i) c[i] = kv[i] / sqrt(ms + 1e-6) * m->g_kv[i];
    latent_rope(m, k_rope + (size_t)j * R, kv + L, j);
    matvec(kvb, m->w_kvb, NULL, c, H * (P + V), L);
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < P; ++i) k_nope[((size_t)j * H + h) * P + i] = kvb[h * (P + V) + i];
      for (int i = 0; i < V; ++i) vv[((size_t)j * H + h) * V + i] = kvb[h * (P + V) + P + i];
    }
  }
  matvec(q, m->w_q, x + (size_t)pos * HID, NULL, H * (P + R), HID);
  for (int h = 0; h < H; ++h) {
    double mx = -INFINITY, sum = 0.0;
    latent_rope(m, q_rope, q + h * (P + R) + P, pos);
    for (int j = 0; j < n; ++j) {
      double sc = 0.0;
      for (int i = 0; i < P; ++i) sc += q[h * (P + R) + i] * k_nope[((size_t)j * H + h) * P + i];
      for (int i = 0; i < R; ++i) sc += q_rope[i] * k_rope[(size_t)j * R + i];
      p[j] = sc * scale;
      if (p[j] > mx) mx = p[j];
    }
    for (int j = 0; j < n; ++j) sum += (p[j] = exp(p[j] - mx));
    for (int i = 0; i < V; ++i) {
      o[h * V + i] = 0.0;
      for (int j = 0; j < n; ++j) o[h * V + i] += p[j] / sum * vv[((size_t)j * H + h) * V + i];
    }
  }
  matvec(out, m->w_o, NULL, o, HID, H * V);
  free(k_nope), free(vv), free(k_rope), free(kv), free(c), free(kvb), free(q), free(o), free(p), free(q_rope);
}

#endif /* AAR_C_EXAMPLE_H_ */
