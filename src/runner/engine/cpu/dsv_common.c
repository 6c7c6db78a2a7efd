/* runner/engine/cpu/dsv_common.c - the DeepSeek-V4 / V4.1 shared math (dsv_common.h). */
#include "runner/engine/cpu/dsv_common.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/model/tensor.h"

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

void tm_dsv_hc_split(const float *m, const float *scale, const float *base, uint32_t N,
                     uint32_t iters, float eps, float *pre, float *post, float *cb) {
    for (uint32_t i = 0; i < N; i++) {
        pre[i] = sigmoidf_(m[i] * scale[0] + base[i]) + eps;
        post[i] = 2.0f * sigmoidf_(m[N + i] * scale[1] + base[N + i]);
    }
    // comb[j][k]: softmax over k, + eps, then Sinkhorn: column, then (row, column) x iters-1.
    for (uint32_t j = 0; j < N; j++) {
        float *row = cb + j * N, mx = -INFINITY, sum = 0.0f;
        for (uint32_t k = 0; k < N; k++) {
            row[k] = m[2 * N + j * N + k] * scale[2] + base[2 * N + j * N + k];
            mx = fmaxf(mx, row[k]);
        }
        for (uint32_t k = 0; k < N; k++) {
            row[k] = expf(row[k] - mx);
            sum += row[k];
        }
        for (uint32_t k = 0; k < N; k++)
            row[k] = row[k] / sum + eps;
    }
    for (uint32_t it = 0; it < iters; it++) {
        if (it > 0) {
            for (uint32_t j = 0; j < N; j++) {
                float sum = 0.0f;
                for (uint32_t k = 0; k < N; k++)
                    sum += cb[j * N + k];
                for (uint32_t k = 0; k < N; k++)
                    cb[j * N + k] /= sum + eps;
            }
        }
        for (uint32_t k = 0; k < N; k++) {
            float sum = 0.0f;
            for (uint32_t j = 0; j < N; j++)
                sum += cb[j * N + k];
            for (uint32_t j = 0; j < N; j++)
                cb[j * N + k] /= sum + eps;
        }
    }
}

void tm_dsv_rope_head(float *x, uint32_t hd, uint32_t rd, const float *cs, const float *sn,
                      float sign) {
    float *r = x + hd - rd;
    for (uint32_t i = 0; i < rd / 2; i++) {
        float c = cs[i], s = sign * sn[i];
        float a = r[2 * i], b = r[2 * i + 1];
        r[2 * i] = a * c - b * s;
        r[2 * i + 1] = b * c + a * s;
    }
}

int tm_dsv_col_slice(const tm_tensor *t, uint64_t c0, uint64_t n, tm_tensor *out) {
    const uint64_t C = t->shape[t->n_dim - 1], rows = tm_tensor_n_elem(t) / C;
    memset(out, 0, sizeof(*out));
    float *buf = tm_malloc((size_t)(rows * n) * sizeof(float));
    float *row = tm_malloc((size_t)C * sizeof(float));
    if (!buf || !row) {
        tm_free(buf);
        tm_free(row);
        return 1;
    }
    for (uint64_t r = 0; r < rows; r++) {
        tm_tensor_row_f32(t, (size_t)r, row);
        memcpy(buf + r * n, row + c0, (size_t)n * sizeof(float));
    }
    tm_free(row);
    out->data = buf;
    out->dtype = TM_DTYPE_F32;
    out->n_dim = t->n_dim;
    memcpy(out->shape, t->shape, sizeof(out->shape));
    out->shape[t->n_dim - 1] = n;
    return 0;
}

void tm_dsv_embed_slice(const tm_tensor *embd, const uint32_t *tok, uint32_t T, uint32_t vocab0,
                        uint32_t n_vocab, uint32_t D, float *x) {
    for (uint32_t t = 0; t < T; t++) {
        const uint32_t row = tok[t] - vocab0; // wraps when below the slice
        if (row < n_vocab)
            tm_dtype_to_f32(embd->data, embd->dtype, (size_t)tok[t] * D, D, x + (size_t)t * D);
        else
            memset(x + (size_t)t * D, 0, D * sizeof(float));
    }
}

/* ---- the reference's kernels (quantize-then-dequantize; dsv41.c and dsv41_dspark.c) ---- */

/* 2^ceil(log2(amax * max_inv)) from the fp32 product's bits, as the kernels' fast_round_scale. */
static float round_scale(float amax, float max_inv) {
    const float x = amax * max_inv;
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    const int32_t ex = (int32_t)((bits >> 23) & 0xffu), lg = ex - 127 + ((bits & 0x7fffffu) != 0);
    const uint32_t out = (uint32_t)(lg + 127) << 23;
    float f;
    memcpy(&f, &out, sizeof(f));
    return f;
}

/* e4m3fn round-to-nearest-even after clamping to +-448 (the kernels' satfinite cast). */
static float e4m3_sat(float v) {
    return tm_e4m3_to_f32(tm_f32_to_e4m3(tm_dsv_clampf(v, -448.0f, 448.0f)));
}

/* e2m1 round-to-nearest-even of v in [-6, 6] (ties to the even code), sign kept. */
static float e2m1_round(float v) {
    static const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const int tie_up[7] = {0, 1, 0, 1, 0, 1, 0};
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float a = fabsf(v);
    int code = 0;
    for (int i = 0; i < 7; i++)
        code += (a > mids[i]) || (a == mids[i] && tie_up[i]);
    return signbit(v) ? -mag[code] : mag[code];
}

void tm_dsv_act_quant(float *x, uint32_t n) {
    for (uint32_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        for (uint32_t i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b + i]));
        const float s = round_scale(fmaxf(amax, 1e-4f), (float)(1.0 / 448.0));
        for (uint32_t i = 0; i < 32; i++)
            x[b + i] = e4m3_sat(x[b + i] / s) * s;
    }
}

void tm_dsv_fp4_act_quant(float *x, uint32_t n, uint32_t block, int e4m3_scale) {
    for (uint32_t b = 0; b < n; b += block) {
        float amax = 0.0f, s;
        for (uint32_t i = 0; i < block; i++)
            amax = fmaxf(amax, fabsf(x[b + i]));
        if (e4m3_scale)
            s = e4m3_sat(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f);
        else
            s = round_scale(fmaxf(amax, 6.0f * 0x1p-126f), (float)(1.0 / 6.0));
        for (uint32_t i = 0; i < block; i++)
            x[b + i] = e2m1_round(tm_dsv_clampf(x[b + i] / s, -6.0f, 6.0f)) * s;
    }
}

void tm_dsv_rmsnorm(float *x, const float *w, uint32_t n, float eps) {
    double ss = 0.0;
    for (uint32_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    const double r = 1.0 / sqrt(ss / n + (double)eps);
    for (uint32_t i = 0; i < n; i++)
        x[i] = (float)((double)x[i] * r * (w ? (double)w[i] : 1.0));
}

void tm_dsv_vec_f32(const tm_tensor *t, float *out) {
    tm_dtype_to_f32(t->data, t->dtype, 0, (size_t)tm_tensor_n_elem(t), out);
}

void tm_dsv_cos_sin(const float *inv_freq, uint32_t rd, uint32_t pos, float *cs, float *sn) {
    for (uint32_t i = 0; i < rd / 2; i++) {
        const float ang = (float)pos * inv_freq[i];
        cs[i] = (float)cos((double)ang);
        sn[i] = (float)sin((double)ang);
    }
}

/* ---- hyper-connection collapse / expand, the clamped SwiGLU ---- */

#define HC_MAX 8 /* streams: tm_dsv_hc_split's bound (TM_DSV41_MAX_HC) */

void tm_dsv_hc_collapse(const float *s, uint32_t N, uint32_t D, uint32_t T, const float *pre,
                        float *x) {
    for (uint32_t t = 0; t < T; t++) {
        const float *st = s + (size_t)t * N * D, *p = pre + (size_t)t * N;
        for (uint32_t d = 0; d < D; d++) {
            double acc = 0.0;
            for (uint32_t i = 0; i < N; i++)
                acc += (double)p[i] * st[i * D + d];
            x[(size_t)t * D + d] = (float)acc;
        }
    }
}

void tm_dsv_hc_expand(float *s, uint32_t N, uint32_t D, uint32_t T, const float *y,
                      const float *post, const float *comb) {
    for (uint32_t t = 0; t < T; t++) {
        float *st = s + (size_t)t * N * D;
        const float *po = post + (size_t)t * N, *cb = comb + (size_t)t * N * N;
        for (uint32_t d = 0; d < D; d++) {
            double out[HC_MAX];
            for (uint32_t k = 0; k < N; k++) {
                double acc = 0.0;
                for (uint32_t j = 0; j < N; j++)
                    acc += (double)cb[j * N + k] * st[j * D + d];
                out[k] = (double)po[k] * y[(size_t)t * D + d] + acc;
            }
            for (uint32_t k = 0; k < N; k++)
                st[k * D + d] = (float)out[k];
        }
    }
}

void tm_dsv_swiglu(float *g, const float *u, uint32_t n, uint32_t I, float lim, const float *wt) {
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < I; i++) {
            float gv = g[(size_t)t * I + i], uv = u[(size_t)t * I + i];
            if (lim > 0.0f) {
                uv = tm_dsv_clampf(uv, -lim, lim);
                gv = fminf(gv, lim);
            }
            double h = (double)gv / (1.0 + exp(-(double)gv)) * uv;
            if (wt)
                h *= (double)wt[t];
            g[(size_t)t * I + i] = (float)h;
        }
}

void tm_dsv_collapse_norm(const float *s, uint32_t N, uint32_t D, uint32_t T, const float *pre,
                          const tm_tensor *norm, float eps, float *nw, float *x) {
    tm_dsv_hc_collapse(s, N, D, T, pre, x);
    tm_dsv_vec_f32(norm, nw);
    for (uint32_t t = 0; t < T; t++)
        tm_dsv_rmsnorm(x + (size_t)t * D, nw, D, eps);
}

void tm_dsv_hc_mix_split(const float *s, uint32_t N, uint32_t D, uint32_t T, float *mixes,
                         const tm_tensor *scale, const tm_tensor *base, float norm_eps,
                         uint32_t iters, float hc_eps, float *pre, float *post, float *comb) {
    const uint32_t ND = N * D, mix = (2 + N) * N;
    float sc[3], bs[(2 + HC_MAX) * HC_MAX];
    tm_dsv_vec_f32(scale, sc);
    tm_dsv_vec_f32(base, bs);
    for (uint32_t t = 0; t < T; t++) {
        const float *st = s + (size_t)t * ND;
        double ss = 0.0;
        for (uint32_t i = 0; i < ND; i++)
            ss += (double)st[i] * st[i];
        const double r = 1.0 / sqrt(ss / ND + (double)norm_eps);
        float *m = mixes + (size_t)t * mix;
        for (uint32_t i = 0; i < mix; i++)
            m[i] = (float)((double)m[i] * r);
        tm_dsv_hc_split(m, sc, bs, N, iters, hc_eps, pre + (size_t)t * N, post + (size_t)t * N,
                        comb + (size_t)t * N * N);
    }
}
