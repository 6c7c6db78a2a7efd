/* runner/engine/cpu/ops.c - host reference ops (see ops.h). The hot loops (dot products, bf16
 * widening) use GCC/Clang vector extensions on 16-byte vectors: portable C with no intrinsics,
 * vectorised the same way at -O2 and -O3 on every target (auto-vectorisation of the plain-loop
 * version was slow at -O2 and 8x slower still at -O3 with gcc 12). Dot products keep 8 lane-wise
 * partial sums folded in a fixed tree, with no -ffast-math reliance, so results are the same bits
 * for a given build with FP contraction off (the default under -std=c11). */
#include "runner/engine/cpu/ops.h"

#include <math.h>

#include "base/err.h"

#define LANES 8 /* partial sums per dot product: two 4-float vectors */

typedef float f32x4 __attribute__((vector_size(16)));

static inline f32x4 load4(const float *p) {
    f32x4 v;
    memcpy(&v, p, sizeof(v)); // unaligned load
    return v;
}

// Fold the LANES partial sums in a fixed tree: (0+4, 1+5, 2+6, 3+7), then pairs, then the last.
static inline float fold(const float *acc) {
    float s0 = acc[0] + acc[4], s1 = acc[1] + acc[5], s2 = acc[2] + acc[6], s3 = acc[3] + acc[7];
    return (s0 + s2) + (s1 + s3);
}

// Lane j of the partial sums holds the products of elements i with i % LANES == j: lanes 0-3 in
// the low vector, 4-7 in the high one; the tail (n % LANES elements) goes to lanes 0, 1, ...
static inline void spill(f32x4 lo, f32x4 hi, float *acc) {
    memcpy(acc, &lo, sizeof(lo));
    memcpy(acc + 4, &hi, sizeof(hi));
}

float tm_cpu_dot(const float *a, const float *b, size_t n) {
    f32x4 lo = {0}, hi = {0};
    size_t i = 0;
    // hot loop: the dot product
    for (; i + LANES <= n; i += LANES) {
        lo += load4(a + i) * load4(b + i);
        hi += load4(a + i + 4) * load4(b + i + 4);
    }
    float acc[LANES];
    spill(lo, hi, acc);
    for (int j = 0; i < n; i++, j++)
        acc[j] += a[i] * b[i];
    return fold(acc);
}

// Four dots of x against four weight rows at once, so each x element is loaded once for four
// rows. Lane by lane the same operations as tm_cpu_dot, hence the same bits.
static void dot4(const float *x, const float *w0, const float *w1, const float *w2, const float *w3,
                 size_t n, float *out) {
    f32x4 l0 = {0}, h0 = {0}, l1 = {0}, h1 = {0}, l2 = {0}, h2 = {0}, l3 = {0}, h3 = {0};
    size_t i = 0;
    // hot loop: 4-row matmul micro-kernel
    for (; i + LANES <= n; i += LANES) {
        f32x4 xl = load4(x + i), xh = load4(x + i + 4);
        l0 += xl * load4(w0 + i);
        h0 += xh * load4(w0 + i + 4);
        l1 += xl * load4(w1 + i);
        h1 += xh * load4(w1 + i + 4);
        l2 += xl * load4(w2 + i);
        h2 += xh * load4(w2 + i + 4);
        l3 += xl * load4(w3 + i);
        h3 += xh * load4(w3 + i + 4);
    }
    float a0[LANES], a1[LANES], a2[LANES], a3[LANES];
    spill(l0, h0, a0);
    spill(l1, h1, a1);
    spill(l2, h2, a2);
    spill(l3, h3, a3);
    for (int j = 0; i < n; i++, j++) {
        a0[j] += x[i] * w0[i];
        a1[j] += x[i] * w1[i];
        a2[j] += x[i] * w2[i];
        a3[j] += x[i] * w3[i];
    }
    out[0] = fold(a0);
    out[1] = fold(a1);
    out[2] = fold(a2);
    out[3] = fold(a3);
}

static inline float bias_at(const tm_k_matmul_args *a, uint32_t o) {
    if (!a->bias)
        return 0.0f;
    float b;
    tm_dtype_to_f32(a->bias, a->bias_dtype, o, 1, &b);
    return b;
}

static inline void store(const tm_k_matmul_args *a, uint32_t t, uint32_t o, float dot) {
    float v = dot;
    if (a->bias)
        v += bias_at(a, o);
    size_t at = (size_t)t * a->ld_out + o;
    if (a->res)
        v += a->res[at];
    a->out[at] = v;
}

void tm_cpu_matmul_rows(const tm_k_matmul_args *a, uint32_t o0, uint32_t o1, float *wbuf) {
    TM_ASSERT(o0 <= o1 && o1 <= a->n_out && a->ld_out >= a->n_out);
    const size_t n_in = a->n_in;
    uint32_t o = o0;
    for (; o + TM_CPU_MM_ROWS <= o1; o += TM_CPU_MM_ROWS) {
        const float *w[TM_CPU_MM_ROWS];
        for (int r = 0; r < TM_CPU_MM_ROWS; r++) {
            if (a->wq) {
                tm_tensor_row_f32(a->wq, (size_t)(a->wq_row0 + o + r), wbuf + r * n_in);
                w[r] = wbuf + r * n_in;
            } else if (a->w_dtype == TM_DTYPE_F32) {
                w[r] = (const float *)a->w + (size_t)(o + r) * n_in;
            } else {
                tm_dtype_to_f32(a->w, a->w_dtype, (size_t)(o + r) * n_in, n_in, wbuf + r * n_in);
                w[r] = wbuf + r * n_in;
            }
        }
        for (uint32_t t = 0; t < a->n_tok; t++) {
            float d[TM_CPU_MM_ROWS];
            dot4(a->x + (size_t)t * n_in, w[0], w[1], w[2], w[3], n_in, d);
            for (int r = 0; r < TM_CPU_MM_ROWS; r++)
                store(a, t, o + r, d[r]);
        }
    }
    for (; o < o1; o++) {
        const float *w = (const float *)a->w + (size_t)o * n_in;
        if (a->wq) {
            tm_tensor_row_f32(a->wq, (size_t)(a->wq_row0 + o), wbuf);
            w = wbuf;
        } else if (a->w_dtype != TM_DTYPE_F32) {
            tm_dtype_to_f32(a->w, a->w_dtype, (size_t)o * n_in, n_in, wbuf);
            w = wbuf;
        }
        for (uint32_t t = 0; t < a->n_tok; t++)
            store(a, t, o, tm_cpu_dot(a->x + (size_t)t * n_in, w, n_in));
    }
}

void tm_cpu_matmul(const tm_k_matmul_args *a, float *wbuf) {
    tm_cpu_matmul_rows(a, 0, a->n_out, wbuf);
}

void tm_cpu_rmsnorm(const tm_k_rmsnorm_args *a) {
    for (uint32_t r = 0; r < a->n_row; r++) {
        const float *x = a->x + (size_t)r * a->n_col;
        float *y = a->out + (size_t)r * a->n_col;
        float ss = tm_cpu_dot(x, x, a->n_col);
        float scale = 1.0f / sqrtf(ss / (float)a->n_col + a->eps);
        for (uint32_t c = 0; c < a->n_col; c++) {
            float w;
            tm_dtype_to_f32(a->w, a->w_dtype, c, 1, &w);
            y[c] = w * (x[c] * scale);
        }
    }
}

void tm_cpu_rope(const tm_k_rope_args *a) {
    const uint32_t half = a->head_dim / 2;
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const float *c = a->cos + (size_t)t * half;
        const float *s = a->sin + (size_t)t * half;
        for (uint32_t h = 0; h < a->n_head; h++) {
            float *x = a->x + (size_t)t * a->ld_x + (size_t)h * a->head_dim;
            for (uint32_t i = 0; i < half; i++) {
                float x0 = x[i], x1 = x[i + half];
                x[i] = x0 * c[i] - x1 * s[i];
                x[i + half] = x1 * c[i] + x0 * s[i];
            }
        }
    }
}

void tm_cpu_rope_table(const uint32_t *pos, uint32_t n_tok, const float *inv_freq,
                       uint32_t head_dim, float *cos_out, float *sin_out) {
    const uint32_t half = head_dim / 2;
    for (uint32_t t = 0; t < n_tok; t++) {
        for (uint32_t i = 0; i < half; i++) {
            float ang = (float)pos[t] * inv_freq[i];
            cos_out[(size_t)t * half + i] = cosf(ang);
            sin_out[(size_t)t * half + i] = sinf(ang);
        }
    }
}

void tm_cpu_attn_head(const tm_k_attn_args *a, uint32_t h, float *scores) {
    const uint32_t hd = a->head_dim, bs = a->block_size;
    const uint32_t kv_dim = a->n_kv_head * hd;
    const uint32_t kvh = h / (a->n_head / a->n_kv_head);
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const float *q = a->q + (size_t)t * a->ld_q + (size_t)h * hd;
        float *out = a->out + (size_t)t * a->ld_q + (size_t)h * hd;
        const uint32_t n_pos = a->pos0 + t + 1;
        const uint32_t p0 = a->window && n_pos > a->window ? n_pos - a->window : 0;
        float mx = -INFINITY;
        for (uint32_t p = p0; p < n_pos; p++) {
            size_t row = (size_t)a->block_table[p / bs] * bs + p % bs;
            const float *k = a->k_cache + row * kv_dim + (size_t)kvh * hd;
            float s = tm_cpu_dot(q, k, hd) * a->scale;
            scores[p] = s;
            mx = s > mx ? s : mx;
        }
        float sum = 0.0f;
        for (uint32_t p = p0; p < n_pos; p++) {
            scores[p] = expf(scores[p] - mx);
            sum += scores[p];
        }
        const float inv = 1.0f / sum;
        for (uint32_t i = 0; i < hd; i++)
            out[i] = 0.0f;
        // hot loop: weighted sum of V rows
        for (uint32_t p = p0; p < n_pos; p++) {
            size_t row = (size_t)a->block_table[p / bs] * bs + p % bs;
            const float *v = a->v_cache + row * kv_dim + (size_t)kvh * hd;
            const float w = scores[p] * inv;
            for (uint32_t i = 0; i < hd; i++)
                out[i] += w * v[i];
        }
    }
}

void tm_cpu_attn(const tm_k_attn_args *a, float *scores) {
    for (uint32_t h = 0; h < a->n_head; h++)
        tm_cpu_attn_head(a, h, scores);
}

void tm_cpu_silu_mul(const tm_k_silu_mul_args *a) {
    for (size_t i = 0; i < a->n; i++) {
        float g = a->gate[i];
        a->out[i] = g / (1.0f + expf(-g)) * a->up[i];
    }
}
